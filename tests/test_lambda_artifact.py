"""The code artifact the functions ship (template.yaml's CodeUri), as
``infra/stage-app.sh`` stages it for ``infra/build.sh``: imported and invoked
on its own, in a fresh interpreter whose ``core`` and ``handler`` come from
the staged directory and nowhere else.

The in-process handler tests (tests/test_lambda_handlers.py) import the
checkout, which holds every file; this one is what catches a file the
artifact leaves out (the staging once copied ``*.py`` only, and both
functions failed at import without the cl100k_base merge table).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# write, rebuild, compile through the event files, S3 under moto; prints
# where core came from and the three answers
PROBE = r"""
import base64, json, sys
from pathlib import Path
import boto3
from moto import mock_aws

events = Path(sys.argv[1])
def event(name, key=None):
    data = json.loads((events / name).read_text())
    if key is not None:
        data["headers"]["authorization"] = "Bearer " + key
    return data

class Context:
    function_name = "titen-artifact"
    aws_request_id = "c6af9ac6-7b61-11e6-9a41-93e812345678"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:titen-artifact"
    memory_limit_in_mb = 1024
    def get_remaining_time_in_millis(self):
        return 900_000

with mock_aws():
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="titen-artifact")
    import core, handler.api, handler.rebuild
    from core.keys import KeyRing
    key = KeyRing(handler.api.service.store).create("demo", "agent", ["context:compile", "memory:write"], [])
    written = handler.api.handler(event("observation.json", key["api_key"]), Context())
    rebuilt = handler.rebuild.handler(event("rebuild-org.json"), Context())
    compiled = handler.api.handler(event("compile.json", key["api_key"]), Context())
    print(json.dumps({"core": core.__file__, "handler": handler.api.__file__,
                      "written": [written["statusCode"], json.loads(written["body"])],
                      "rebuilt": rebuilt,
                      "compiled": [compiled["statusCode"], json.loads(compiled["body"])]}))
"""


def test_the_staged_artifact_starts_and_answers_a_write_and_a_compile(tmp_path):
    app = tmp_path / "app"
    subprocess.run([str(ROOT / "infra" / "stage-app.sh"), str(app)], check=True)
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("TITEN_", "AWS_")) and name != "PYTHONPATH"}
    env.update({"PYTHONPATH": str(app), "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1", "TITEN_STORE": "s3://titen-artifact/",
                "TITEN_CACHE_DIR": str(tmp_path / "cache"), "TITEN_SNAPSHOT_TTL": "0"})
    # -P: the probe's own directory is not on the path; cwd holds no code either
    run = subprocess.run([sys.executable, "-P", "-c", PROBE, str(ROOT / "infra" / "events")], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["core"].startswith(str(app)) and out["handler"].startswith(str(app))
    status, written = out["written"]
    assert status == 201, written
    status, compiled = out["compiled"]
    assert status == 200, compiled
    assert [item["claim_id"] for item in compiled["data"]["items"]] == [written["data"]["claim_id"]]
