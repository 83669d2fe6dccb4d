"""The JSON the service reads and writes, as pydantic models (they are also its OpenAPI schema).

Requests are strict: a number where a string belongs, a string where a number belongs, or an
option that does not exist is an error, never guessed at. Values are checked where they are
defined (`DecodeConfig` for the decoding settings, `ServeConfig` for the limits), so the service
and the command line refuse the same things with the same words.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from transformer.config import DecodeConfig

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
DECODE_SETTINGS = {field.name for field in dataclasses.fields(DecodeConfig)}


class DecodeOptions(BaseModel):
    """Decoding settings a request may change; the others are the server's (`DecodeConfig`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    beam_size: int | None = Field(None, description="1 is greedy search")
    length_penalty: FiniteFloat | None = Field(None, description="GNMT's alpha; 0 ranks by log-probability")
    sampling: bool | None = Field(None, description="draw nbest samples per sentence instead of searching")
    sampling_topk: int | None = Field(None, description="sample from the k most likely tokens (0: all)")
    sampling_topp: FiniteFloat | None = Field(None, description="sample from the nucleus of this probability")
    sampling_temperature: FiniteFloat | None = Field(None, description="> 1 flattens the distribution")
    seed: int | None = Field(None, description="the same seed gives the same samples")
    tgt_lang: str | None = Field(None, description="the language to translate into: needed by a multilingual "
                                                   "model (GET /model lists its target_languages)")

    def overrides(self) -> dict[str, Any]:
        """The decoding settings this request gives, as `DecodeConfig` fields (its other fields are its input)."""
        return self.model_dump(include=DECODE_SETTINGS, exclude_none=True)


def _encodable(sentence: str) -> str:
    try:
        sentence.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("not valid Unicode (a lone surrogate escape)") from None
    return sentence


Sentence = Annotated[str, AfterValidator(_encodable)]  # JSON's "\ud800" decodes, but no tokenizer can take it


class TranslateRequest(DecodeOptions):
    text: list[Sentence] = Field(min_length=1, description="one sentence, or a list of sentences",
                                 examples=[["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]])
    nbest: int | None = Field(None, description="translations per sentence, best first (at most beam_size), "
                                                "or samples")
    prefix: list[Sentence] | None = Field(None, description="per sentence, the start its translation must have "
                                                            "(a string for one sentence)")
    constraints: list[list[Sentence]] | None = Field(
        None, description="per sentence, the phrases its translation must contain (lexically constrained beam "
                          "search)", examples=[[["bicycle"], []]])
    alignments: bool = Field(False, description="add each translation's word alignment, Moses-style i-j pairs")

    @field_validator("text", "prefix", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list) and (value is not None or info.field_name == "text"):
            raise ValueError("must be a string or a list of strings")
        return value

    @model_validator(mode="after")
    def _one_per_sentence(self) -> TranslateRequest:
        for name in ("prefix", "constraints"):
            given = getattr(self, name)
            if given is not None and len(given) != len(self.text):
                raise ValueError(f"{name}: {len(given)} given for {len(self.text)} sentences; give one per sentence")
        return self


class AttentionRequest(DecodeOptions):
    text: Sentence = Field(description="one sentence", examples=["Ein Mann fährt Fahrrad."])


class Hypothesis(BaseModel):
    text: str
    score: float = Field(description="log-probability normalised by the length penalty, as beam search ranks")
    alignment: str | None = Field(None, description="only with alignments: source-target word pairs, e.g. 0-0 1-2")


class Translation(Hypothesis):
    nbest: list[Hypothesis] = Field(description="the nbest translations, best first (the first is this one); "
                                                "with sampling, the samples in the order drawn")
    truncated: bool = Field(description="the source was longer than the model reads and was cut")


class Timing(BaseModel):
    queue_ms: float = Field(description="waiting for a batch")
    translate_ms: float = Field(description="the translator call this request shared")
    total_ms: float


class BatchInfo(BaseModel):
    requests: int = Field(description="requests translated in the same call")
    sentences: int


class TranslateResponse(BaseModel):
    translations: list[Translation]
    timing: Timing
    batch: BatchInfo


class AttentionResponse(BaseModel):
    source: list[str] = Field(description="source subwords (columns)")
    target: list[str] = Field(description="target subwords (rows)")
    weights: list[list[float]] = Field(description="cross-attention of the last decoder layer, mean over heads")


class Health(BaseModel):
    status: Literal["ready", "busy"] = Field(description="busy: translating, or requests waiting")
    queued_requests: int
    queued_sentences: int


class ErrorResponse(BaseModel):
    error: str = Field(description="one line saying what was wrong")


def validation_error(errors: list[dict[str, Any]]) -> tuple[int, str]:
    """The status and one line for pydantic's errors of a request body, naming the field of the first:
    400 for a body that is not a JSON object, 422 for a field that is wrong."""
    error = errors[0]
    where = [part for part in error["loc"] if part != "body"]
    if error["type"] == "json_invalid":
        return 400, f"the body is not valid JSON ({error.get('ctx', {}).get('error', 'decode error')})"
    if not where and error["type"] == "value_error":  # a check of the whole request, naming its field itself
        return 422, error["msg"].removeprefix("Value error, ")
    if not where:
        return 400, 'the body must be a JSON object, e.g. {"text": "..."}, sent as Content-Type: application/json'
    if error["type"] == "extra_forbidden":
        return 422, f"unknown option {where[0]!r} (the options are in the API documentation, /docs)"
    field = str(where[0]) + "".join(f"[{part}]" for part in where[1:])
    return 422, f"{field}: {'required' if error['type'] == 'missing' else error['msg'].removeprefix('Value error, ')}"
