"""Amazon Titan Text Embeddings V2 on Bedrock (``bedrock:amazon.titan-embed-text-v2:0[:dims]``).

One ``InvokeModel`` per text: request body ``{"inputText", "dimensions",
"normalize": true}``, response body ``{"embedding": [...],
"inputTextTokenCount": n}``. Dimensions 256, 512 or 1024 (the default).
"""

from __future__ import annotations

import json

from core.vectors.calibration import Calibration
from core.vectors.embedder import EmbedderError, Fingerprint, prepare

TITAN_V2 = "amazon.titan-embed-text-v2:0"
TITAN_DIMENSIONS = (256, 512, 1024)
MAX_INPUT_CHARS = 50_000  # the model's limit on inputText
# Not yet measured on the calibration set (that needs Bedrock access): a
# guessed floor and ceiling with the cap below 1, so a neighbour never ties
# (and so never displaces) the best keyword match whatever the guess is
# worth; `bench.calibration_eval --sweep --embedder bedrock:...` measures
# them (docs/vectors.md) and TITEN_EMBED_CALIBRATION sets the measured
# values without a release.
CALIBRATION = Calibration(floor=0.25, ceiling=0.6, knn=10, cap=0.99, basis="provisional: not measured for Titan")


class BedrockTitanEmbedder:
    def __init__(self, model_id: str = TITAN_V2, dimensions: int = 1024, *, client=None,
                 calibration: Calibration = CALIBRATION):
        if model_id != TITAN_V2:
            raise ValueError(f"bedrock embedder: only {TITAN_V2} is supported, not {model_id!r}")
        if dimensions not in TITAN_DIMENSIONS:
            raise ValueError(f"bedrock embedder: dimensions must be one of {TITAN_DIMENSIONS}")
        self.model_id = model_id
        self.dimensions = dimensions
        self._client = client
        self.fingerprint = Fingerprint("bedrock", model_id, "2", dimensions, calibration)

    @classmethod
    def from_spec(cls, rest: str) -> "BedrockTitanEmbedder":
        # rest is "amazon.titan-embed-text-v2:0" or "amazon.titan-embed-text-v2:0:512"
        parts = rest.split(":")
        if len(parts) == 3:
            return cls(":".join(parts[:2]), int(parts[2]))
        return cls(rest)

    @property
    def client(self):
        if self._client is None:
            import boto3
            from botocore.config import Config

            self._client = boto3.client("bedrock-runtime", config=Config(
                connect_timeout=2, read_timeout=5, retries={"max_attempts": 2, "mode": "standard"}))
        return self._client

    def request_body(self, text: str) -> bytes:
        return json.dumps({"inputText": prepare(text)[:MAX_INPUT_CHARS], "dimensions": self.dimensions,
                           "normalize": True}, separators=(",", ":")).encode()

    def embed(self, texts: list[str]) -> list[list[float]]:
        out = []
        for text in texts:
            try:
                response = self.client.invoke_model(modelId=self.model_id, body=self.request_body(text),
                                                    contentType="application/json", accept="application/json")
                payload = json.loads(response["body"].read())
            except Exception as exc:
                raise EmbedderError(f"bedrock invoke_model failed: {type(exc).__name__}") from exc
            vector = payload.get("embedding") if isinstance(payload, dict) else None
            if not isinstance(vector, list) or len(vector) != self.dimensions:
                raise EmbedderError("bedrock returned no embedding of the configured dimensions")
            out.append([float(v) for v in vector])
        return out
