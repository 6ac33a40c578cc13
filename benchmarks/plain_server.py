"""The same model in one plain uvicorn + Starlette process, no Ray: what a user would otherwise write.

    python benchmarks/plain_server.py CHECKPOINT --port 8100

One request, one forward (no batching), JSON in and out: the baseline the
serving benchmark compares raymodel's route with.
"""

from __future__ import annotations

import argparse
import json

import torch
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import raymodel as rm


def app_for(checkpoint: str) -> Starlette:
    model = rm.RayModel.from_checkpoint(checkpoint)
    for module in model.backend.modules(model).values():
        module.eval()

    async def predict(request: Request) -> JSONResponse:
        payload = json.loads(await request.body())
        x = torch.tensor(payload["pixels"], dtype=torch.float32)
        with torch.inference_mode():
            out = model.net(x)
        return JSONResponse({"digit": out.argmax(-1).tolist()})

    return Starlette(routes=[Route("/", predict, methods=["POST"])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--port", type=int, default=8100)
    args = parser.parse_args()
    uvicorn.run(app_for(args.checkpoint), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
