"""The API's surface as its OpenAPI schema describes it: every route, its methods, operation id,
parameters (where and what each is called) and the statuses it may answer, compared with the
recorded `tests/api_surface.json`. A change to the api's modules that changes none of this
leaves the file as it is; a new or changed route records it again:

    python -m tests.test_api_surface > tests/api_surface.json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from litestar.serialization import encode_json

from services.api.app import Settings, create_app

RECORDED = Path(__file__).with_name("api_surface.json")


def surface() -> dict[str, Any]:
    """The schema's routes, made without serving anything (no server is reached)."""
    app = create_app(Settings("nats://127.0.0.1:1", "postgresql://nobody@127.0.0.1:1/none"))
    schema = json.loads(encode_json(app.openapi_schema.to_schema()))
    return {
        path: {
            method: {
                "operation": op["operationId"],
                "parameters": [f"{p['in']}:{p['name']}" for p in op.get("parameters", [])],
                "body": "requestBody" in op,
                "statuses": sorted(op["responses"]),
            }
            for method, op in sorted(item.items())
        }
        for path, item in sorted(schema["paths"].items())
    }


def test_the_api_surface_is_the_recorded_one() -> None:
    assert surface() == json.loads(RECORDED.read_text())


if __name__ == "__main__":
    print(json.dumps(surface(), indent=1))
