"""Keeping generations fresh: who asks for a rebuild, and when it runs.

``queue`` is the per-organization rebuild request a write sends (an SQS
FIFO message on Lambda), ``backlog`` tells from the pointer and one ledger
listing whether an organization has entries its generation lacks (the
schedule's safety net), ``runner`` is the rebuild function's work for each
way in. The build itself is ``core.snapshot.build``.
"""
