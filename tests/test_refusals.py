"""Refusals travel as codes: every code has its words and its HTTP status, and a refusal
stored or answered before codes existed still decodes."""

from __future__ import annotations

from typing import get_args

import msgspec

from events import JobRejected
from events.commands import Reply, decode_reply
from events.refusals import WORDS, RefusalCode, say
from events.versions import decode_event
from policy.commands import Refused
from policy.commands.outcome import refuse
from services.api.errors import REFUSAL_STATUS, UNCODED_STATUS


def test_every_code_has_its_words_and_its_status() -> None:
    codes = set(get_args(RefusalCode))
    assert set(WORDS) == codes
    assert set(REFUSAL_STATUS) == codes
    assert REFUSAL_STATUS["not_found"] == 404 and UNCODED_STATUS == 422


def test_a_refusal_carries_its_code_field_and_words_naming_the_value() -> None:
    refused = refuse("unknown_pool", "pools", "tpu", known="gpu, cpu")
    assert refused == Refused("unknown_pool", "pools", "unknown pool 'tpu' (known: gpu, cpu)")
    assert say("not_found", "ghost") == "unknown job id 'ghost'"


def test_a_rejection_and_a_reply_from_before_codes_still_decode() -> None:
    stored = b'{"type":"JobRejected","version":2,"id":"r","time":1.0,"actor":"admission",'
    stored += b'"job_id":"j1","reason":"unknown project \'x\' (known: a)"}'
    old = decode_event(stored)
    assert isinstance(old, JobRejected) and old.code is None and old.field is None
    reply = decode_reply(b'{"ok":false,"error":"unknown job id \'j\'"}')
    assert reply.code is None and REFUSAL_STATUS.get(reply.code or "", UNCODED_STATUS) == 422


def test_a_code_added_later_still_decodes() -> None:
    # a reader older than a code must not stop at a rejection that carries it
    newer = Reply(ok=False, error="words", code="a_later_code", field="gpus")
    assert decode_reply(msgspec.json.encode(newer)).code == "a_later_code"
