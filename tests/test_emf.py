"""core/observe/emf.py: CloudWatch Embedded Metric Format documents, one line each.

Every document is checked against the specification's rules (tests/emf_spec.py);
the settings that turn metrics on and name organizations are core/config.py's.
"""

import io
import json
import math
import threading

import pytest

from core.config import MAX_METRIC_ORGANIZATIONS, Settings
from core.observe.emf import Group, Metric, Metrics, document
from emf_spec import assert_emf, metric_values

LATENCY = Metric("Latency", "Milliseconds")
REQUESTS = Metric("Requests", "Count")
ERRORS = Metric("Errors", "Count")


def test_a_document_follows_the_specification_and_carries_values_at_its_root():
    doc = document("titen/prod", [Group({"Service": "api", "Route": "/healthz"}, {REQUESTS: 1, LATENCY: 2.5})],
                   timestamp_ms=1_700_000_000_123)
    assert_emf(doc)
    assert doc["_aws"] == {"Timestamp": 1_700_000_000_123, "CloudWatchMetrics": [{
        "Namespace": "titen/prod", "Dimensions": [["Service", "Route"]],
        "Metrics": [{"Name": "Requests", "Unit": "Count"}, {"Name": "Latency", "Unit": "Milliseconds"}]}]}
    assert (doc["Service"], doc["Route"], doc["Requests"], doc["Latency"]) == ("api", "/healthz", 1, 2.5)


def test_each_group_is_a_directive_with_its_own_dimensions():
    doc = document("titen", [Group({"Service": "api", "Route": "/mcp"}, {REQUESTS: 1}),
                             Group({"Service": "api", "Code": "FORBIDDEN"}, {ERRORS: 1})])
    assert_emf(doc)
    assert metric_values([doc]) == {
        ("Requests", frozenset({("Service", "api"), ("Route", "/mcp")})): [1],
        ("Errors", frozenset({("Service", "api"), ("Code", "FORBIDDEN")})): [1]}


@pytest.mark.parametrize("organization, dimension_sets", [
    (None, [["Service"]]),
    ("acme", [["Service"], ["Service", "Organization"]]),
])
def test_an_organization_is_a_second_dimension_set_beside_the_groups_own(organization, dimension_sets):
    doc = document("titen", [Group({"Service": "rebuild"}, {REQUESTS: 1})], organization=organization)
    assert_emf(doc)
    assert doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == dimension_sets
    assert doc.get("Organization") == organization


@pytest.mark.parametrize("value", [math.nan, math.inf, None, True, "3"])
def test_a_value_that_is_not_a_finite_number_is_left_out(value):
    doc = document("titen", [Group({"Service": "api"}, {REQUESTS: 1, LATENCY: value})])
    assert_emf(doc)
    assert "Latency" not in doc
    assert [m["Name"] for m in doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]] == ["Requests"]


def test_a_group_left_with_no_value_writes_no_directive():
    doc = document("titen", [Group({"Service": "api"}, {LATENCY: None}), Group({"Service": "api"}, {REQUESTS: 1})])
    assert len(doc["_aws"]["CloudWatchMetrics"]) == 1


def test_one_dimension_with_two_values_in_a_document_is_refused():
    with pytest.raises(ValueError, match="Service"):
        document("titen", [Group({"Service": "api"}, {REQUESTS: 1}), Group({"Service": "rebuild"}, {ERRORS: 1})])


def test_a_unit_cloudwatch_does_not_know_is_refused():
    with pytest.raises(ValueError, match="Millis"):
        Metric("Latency", "Millis")


def test_metrics_write_one_json_line_per_document():
    out = io.StringIO()
    metrics = Metrics("titen", enabled=True, stream=out)
    metrics.emit([Group({"Service": "api"}, {REQUESTS: 1})])
    metrics.emit([Group({"Service": "api"}, {REQUESTS: 1})])
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    for line in lines:
        assert_emf(json.loads(line))


def test_metrics_write_nothing_when_off():
    out = io.StringIO()
    assert Metrics("titen", enabled=False, stream=out).emit([Group({"Service": "api"}, {REQUESTS: 1})]) is None
    assert out.getvalue() == ""


@pytest.mark.parametrize("org_id, named", [("acme", True), ("globex", False), (None, False)])
def test_only_named_organizations_get_the_organization_dimension(org_id, named):
    out = io.StringIO()
    Metrics("titen", enabled=True, organizations=("acme",), stream=out).emit(
        [Group({"Service": "api"}, {REQUESTS: 1})], org_id=org_id)
    doc = json.loads(out.getvalue())
    assert ("Organization" in doc) is named
    assert (["Service", "Organization"] in doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"]) is named


def test_lines_written_from_many_threads_never_interleave():
    out = io.StringIO()
    metrics = Metrics("titen", enabled=True, stream=out)
    group = [Group({"Service": "api", "Route": "/v1/context/compile"}, {REQUESTS: 1, LATENCY: 1.0})]
    threads = [threading.Thread(target=lambda: [metrics.emit(group) for _ in range(200)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = out.getvalue().splitlines()
    assert len(lines) == 800 and all(json.loads(line)["Requests"] == 1 for line in lines)


# -- settings -----------------------------------------------------------------------

def test_metrics_are_off_unless_the_environment_turns_them_on():
    settings = Settings.from_env(data_dir="/tmp/unused", env={})
    assert (settings.metrics, settings.metrics_namespace, settings.metrics_organizations) == ("off", "titen", ())
    assert Metrics.from_settings(settings).enabled is False


def test_the_environment_names_the_namespace_and_the_organizations():
    settings = Settings.from_env(data_dir="/tmp/unused", env={
        "TITEN_METRICS": "emf", "TITEN_METRICS_NAMESPACE": "titen/prod", "TITEN_METRICS_ORGS": " acme, globex,,acme"})
    metrics = Metrics.from_settings(settings)
    assert (metrics.enabled, metrics.namespace, metrics.organizations) == (True, "titen/prod", {"acme", "globex"})


@pytest.mark.parametrize("env, message", [
    ({"TITEN_METRICS": "cloudwatch"}, "TITEN_METRICS"),
    ({"TITEN_LOG_FORMAT": "yaml"}, "TITEN_LOG_FORMAT"),
    ({"TITEN_METRICS_ORGS": ",".join(f"org{i}" for i in range(MAX_METRIC_ORGANIZATIONS + 1))}, "at most"),
])
def test_settings_refuse_what_they_cannot_honour(env, message):
    with pytest.raises(ValueError, match=message):
        Settings.from_env(data_dir="/tmp/unused", env=env)
