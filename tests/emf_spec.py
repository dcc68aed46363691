"""The EMF specification's rules, as a checker the tests run over every document.

CloudWatch Logs extracts metrics from a log event only when it is a JSON
object whose ``_aws`` block follows the Embedded Metric Format
specification; a document that breaks a rule is stored as a log line and
yields no metric, silently. These are the rules titen's documents must
keep (the specification's MUSTs that apply to what titen writes).
"""

from core.observe.emf import UNITS


def assert_emf(doc: dict) -> None:
    meta = doc["_aws"]
    assert isinstance(meta["Timestamp"], int) and meta["Timestamp"] > 0, "Timestamp: ms since the epoch"
    directives = meta["CloudWatchMetrics"]
    assert isinstance(directives, list) and directives
    for directive in directives:
        assert set(directive) == {"Namespace", "Dimensions", "Metrics"}, directive
        assert isinstance(directive["Namespace"], str) and 1 <= len(directive["Namespace"]) <= 255
        for dimension_set in directive["Dimensions"]:
            assert isinstance(dimension_set, list) and len(dimension_set) <= 30
            for key in dimension_set:
                value = doc[key]  # every dimension is a member of the root
                assert isinstance(value, str) and 1 <= len(value) <= 1024, (key, value)
        assert 1 <= len(directive["Metrics"]) <= 100
        for metric in directive["Metrics"]:
            assert set(metric) <= {"Name", "Unit", "StorageResolution"} and metric["Unit"] in UNITS, metric
            value = doc[metric["Name"]]  # every metric is a member of the root, a number
            assert isinstance(value, (int, float)) and not isinstance(value, bool), (metric, value)


def metric_values(docs: list[dict]) -> dict[tuple, list]:
    """(metric name, frozenset of (dimension, value)) -> the values written,
    for every dimension set of every document."""
    found: dict[tuple, list] = {}
    for doc in docs:
        for directive in doc["_aws"]["CloudWatchMetrics"]:
            for dimension_set in directive["Dimensions"]:
                dims = frozenset((key, doc[key]) for key in dimension_set)
                for metric in directive["Metrics"]:
                    found.setdefault((metric["Name"], dims), []).append(doc[metric["Name"]])
    return found
