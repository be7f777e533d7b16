"""What a model looked at, per request: /attention (attention probabilities per layer and head)
and /attribute (integrated gradients of a classifier's output), of a text or a pair. Neither is
batched with other requests: an answer grows with the square of the length, or its steps are
the batch."""

from __future__ import annotations

import json
from typing import Any

import torch
from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from bertforge.inference.explain import attention_maps
from bertforge.inference.explain import attribute as explain_attribute
from bertforge.serve.limits import ApiError
from bertforge.serve.routes import ServerDep, device_of, rounded
from bertforge.serve.schemas import AttentionRequest, AttributeRequest

router = APIRouter()


@router.post(
    "/attention",
    summary="tokens and attention probabilities per layer and head, of a text or a pair",
)
async def attention(body: AttentionRequest, server: ServerDep) -> Response:
    served = server.model(body.model, "/attention")
    ids, types, cut = server.explained_ids(served, body.inputs, body.max_tokens)

    def run(batch: list[torch.Tensor]) -> list[bytes]:
        device = device_of(served)
        on_device = None if types is None else types.to(device)
        maps = attention_maps(served.encoder, batch[0].to(device), on_device)  # (L, nh, T, T)
        tok = served.tokenizer
        answer = {
            "model": served.name,
            "tokens": [tok.id_to_token(int(i)) for i in batch[0]],
            **_segments(types),
            "truncated": cut,
            "layers": int(maps.shape[0]),
            "heads": int(maps.shape[1]),
            "attentions": rounded(maps.cpu().numpy(), 4),
        }
        return [json.dumps(answer).encode()]

    key = object()  # never batched: one (L, nh, T, T) answer each
    (payload,) = await server.run(key, [ids], len(ids) ** 2, run)
    return Response(payload, media_type="application/json")


@router.post(
    "/attribute",
    summary="integrated-gradients attribution of a classifier's output, of a text or a pair",
    description='A pair, `{"inputs": ["<text>", "<text_pair>"]}`, is explained over the '
    "tokens of both texts, `[CLS] a [SEP] b [SEP]`, and the answer's `token_type_ids` "
    "say which text each token is of (1: the second).",
)
async def attribute(body: AttributeRequest, server: ServerDep) -> JSONResponse:
    served = server.model(body.model, "/attribute")
    paired = not isinstance(body.inputs, str)
    server.check_pairing(served, paired, "/attribute")
    if not 1 <= body.steps <= server.config.max_attribution_steps:
        raise ApiError(
            422,
            f"steps={body.steps} must be between 1 and "
            f"--max_attribution_steps={server.config.max_attribution_steps}",
            "max-attribution-steps",
        )
    ids, types, cut = server.explained_ids(served, body.inputs, body.max_tokens)
    labels = served.labels()
    regression = served.model.config.is_regression
    target = None
    if body.target is not None:
        if regression:
            raise ApiError(422, f"model {served.name!r} is a regressor: it has no target label")
        if body.target not in labels:
            raise ApiError(422, f"target {body.target!r} is not a label; labels: {labels}")
        target = labels.index(body.target)
    steps = body.steps
    chunk = max(1, server.config.max_batch_tokens // len(ids))

    def run(batch: list[torch.Tensor]) -> list[dict[str, Any]]:
        x = batch[0].to(device_of(served))
        x_types = None if types is None else types.to(x.device)
        explained = explain_attribute(
            served.model, served.tokenizer, x, x_types, target, steps, chunk
        )
        answer: dict[str, Any] = {"model": served.name, "truncated": cut}
        if regression:
            answer["value"] = explained.value
        else:
            answer.update(label=explained.label, scores=explained.scores, target=explained.target)
        result = explained.attribution
        answer.update(
            tokens=[served.tokenizer.id_to_token(int(i)) for i in x],
            **_segments(types),
            attributions=result.attributions.cpu().tolist(),
            steps=steps,
            output=result.output,
            baseline_output=result.baseline_output,
            delta=result.delta,
            baseline="[CLS] [PAD]... [SEP]" + (" [PAD]... [SEP]" if paired else ""),
        )
        return [answer]

    key = object()  # never batched: its steps are the batch
    (answer,) = await server.run(key, [ids], len(ids) * steps, run)
    return JSONResponse(answer)


def _segments(types: torch.Tensor | None) -> dict[str, list[int]]:
    """An answer's ``token_type_ids`` (which text of a pair each token is of), none for a text."""
    return {} if types is None else {"token_type_ids": types.tolist()}
