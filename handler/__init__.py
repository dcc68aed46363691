"""Thin AWS Lambda entry points (docs/architecture.md; the Lambda notes in docs/operations.md).

``handler.api.handler`` serves the HTTP API (API Gateway HTTP API, payload
format 2.0) through Mangum; ``handler.rebuild.handler`` is the scheduled
snapshot rebuild. Neither holds logic a local server would also need: the
Starlette app, the service and the rebuild all live in ``core``.
"""
