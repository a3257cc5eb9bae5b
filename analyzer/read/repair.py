"""Damaged JSON: repair what can be read, salvage the rest.

The careful path validates the whole document; when msgspec refuses it, this module finds where
(cut off at the end, or damaged at byte N), keeps the header and every complete event before that
point, and mends the tokens Python's json writes but JSON forbids (NaN, Infinity, lone surrogates).
Events that fail typed decoding are decoded one by one and their ill-typed fields repaired or dropped.
Kept apart from the column builder so that the fast path for well-formed traces reads on its own.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from . import events as ev
from gpuadvise.analyzer.errors import InputError

_RAW_ARGS = {"Input type", "Input Dims"}
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_ONE_EVENT = msgspec.json.Decoder(ev.Event)
_ANY = msgspec.json.Decoder()

# Python's json.dumps writes NaN/Infinity, which is not JSON; such values become null (and the event is
# then skipped and counted). Only outside strings: a token must follow ':', ',' or '[' and end a value.
_NAN_TOKEN = re.compile(rb"(?<=[:,\[])(\s*)(?:NaN|-?Infinity)(?=\s*[,\]\}])")


_LONE_SURROGATE = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})|(?<![0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")


class _Replaced(bytes):
    """Bytes already re-encoded with U+FFFD for invalid UTF-8 (so we retry only once)."""

    _replaced = True


def nan_tokens_to_null(body):
    """`body` with NaN / Infinity tokens as null and lone surrogates replaced; `body` itself if it has none
    (a memoryview, a mapped file's piece, is searched as bytes)."""
    text = bytes(body) if isinstance(body, memoryview) else body
    fixed = text
    if b"NaN" in fixed or b"Infinity" in fixed:
        if _NAN_TOKEN.search(fixed):
            fixed = _NAN_TOKEN.sub(rb"\1null", bytes(fixed))
    if b"\\ud" in fixed or b"\\uD" in fixed:  # lone UTF-16 surrogates are invalid JSON strings for msgspec
        if _LONE_SURROGATE.search(fixed):
            fixed = _LONE_SURROGATE.sub(rb"\\ufffd", bytes(fixed))
    return body if fixed is text else fixed


SPACE = b"\xef\xbb\xbf \t\r\n"
SPACE_STARTS = {bytes([c]) for c in SPACE}


def decode_document(body: bytes, path: Path):
    try:
        header = ev.HEADER.decode(body)
    except msgspec.ValidationError as exc:
        if "traceEvents" in str(exc):
            raise InputError(path, "'traceEvents' is not a list of events") from None
        raise InputError(path, f"not a Kineto trace ({_short(exc)})") from None
    except msgspec.DecodeError as exc:
        damage = _damage_offset(exc, len(body))
        if damage is not None and damage < len(body) and body[damage] >= 0x80 and not getattr(body, "_replaced", False):
            return decode_document(_Replaced(bytes(body).decode("utf-8", "replace").encode()), path)
        return _salvage_document(body, path, damage)
    except UnicodeDecodeError:
        if not getattr(body, "_replaced", False):  # invalid UTF-8 in the header: read it as U+FFFD, once
            return decode_document(_Replaced(bytes(body).decode("utf-8", "replace").encode()), path)
        raise InputError(path, "not valid UTF-8 text") from None
    except RecursionError:
        raise InputError(path, "JSON nested too deeply to be a trace") from None
    events = header.traceEvents
    head = bytes(memoryview(events)[:64]).lstrip()
    if head.startswith(b"null"):
        raise InputError(path, "JSON has no 'traceEvents' list: not a PyTorch profiler trace")
    if not head.startswith(b"["):
        raise InputError(path, "'traceEvents' is not a list of events")
    header.traceEvents = msgspec.Raw(b"null")
    return header, events, False


def decode_event_list(body: bytes, path: Path):
    try:
        msgspec.json.decode(body, type=msgspec.Raw)  # validate once; events are decoded in chunks later
        return body, False
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        damage = _damage_offset(exc, len(body))
        raws = _salvage_events(body, 0, damage)
        if raws is None:
            raise InputError(path, "not valid JSON") from None
        return raws, ("damaged", damage) if damage is not None else True


def _damage_offset(exc, size: int) -> int | None:
    """Where msgspec found the JSON malformed (byte N), or None when the input was merely cut off
    (msgspec says "truncated", or the bad byte is within the last few bytes: a cut inside a literal)."""
    if isinstance(exc, (UnicodeDecodeError, RecursionError)):
        return None
    m = re.search(r"\(byte (\d+)\)", str(exc))
    if not m or "truncated" in str(exc):
        return None
    offset = int(m.group(1))
    return None if offset >= size - 64 else offset


def _salvage_document(body: bytes, path: Path, damage: int | None = None):
    """A document cut off mid-write (or damaged at byte `damage`): keep the header fields we can and
    every complete event before the cut or the damage."""
    key = body.find(b'"traceEvents"')
    if key < 0:
        raise InputError(path, "not valid JSON and no 'traceEvents' found")
    bracket = body.find(b"[", key)
    if bracket < 0:
        raise InputError(path, "not valid JSON: 'traceEvents' has no list")
    raws = _salvage_events(body, bracket, damage)
    if raws is None:
        where = f" (damaged at byte {damage})" if damage is not None else ""
        raise InputError(path, f"not valid JSON{where}: no complete event could be read")
    header = ev.Header()
    # Header keys written before the events (rare) are lost; keys after the cut are gone anyway.
    tail = body[:key].rstrip().rstrip(b",") + b"}"
    try:
        header = ev.HEADER.decode(tail)
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
        pass
    return header, raws, ("damaged", damage) if damage is not None else True


def _salvage_events(body: bytes, bracket: int, damage: int | None = None, max_tries: int = 200):
    """Cut the list after the last complete event that still parses, walking back from the end (or
    from the damage: everything before it parsed, so the first boundary before it usually works)."""
    pos = len(body) if damage is None else min(len(body), damage)
    for _ in range(max_tries):
        pos = body.rfind(b"}", bracket, pos)
        if pos < 0:
            return [] if body.find(b"{", bracket) < 0 else None
        try:
            return _RAW_LIST.decode(body[bracket : pos + 1] + b"]")
        except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
            continue
    return None


def _short(exc: Exception) -> str:
    return str(exc).splitlines()[0][:120]


# ----------------------------------------------------------------------------------------------------
# Events that fail typed decoding


def decode_leniently(chunk: list, b) -> list:
    """Decode a chunk event by event; repair ill-typed fields where possible, skip the rest (counted in
    the column builder `b`'s `skipped`)."""
    out = []
    for raw in chunk:
        try:
            out.append(_ONE_EVENT.decode(raw))
            continue
        except (msgspec.MsgspecError, RecursionError):
            pass
        except UnicodeDecodeError:  # invalid UTF-8 inside a string: keep the event with U+FFFD in it
            try:
                out.append(_ONE_EVENT.decode(bytes(raw).decode("utf-8", "replace").encode()))
                continue
            except (msgspec.MsgspecError, RecursionError):
                pass
        try:
            obj = _ANY.decode(bytes(raw).decode("utf-8", "replace").encode())
        except (msgspec.MsgspecError, RecursionError):
            b.skipped += 1
            continue
        event = _repair(obj)
        if event is None:
            b.skipped += 1
        else:
            out.append(event)
    return out


def _repair(obj) -> ev.Event | None:
    if not isinstance(obj, dict):
        return None
    args = obj.get("args")
    if isinstance(args, dict):  # the fields kept as raw JSON must be handed over as raw JSON
        for key in _RAW_ARGS & args.keys():
            try:
                args[key] = msgspec.Raw(msgspec.json.encode(args[key]))
            except (msgspec.MsgspecError, TypeError, ValueError, OverflowError):
                del args[key]
    try:
        return msgspec.convert(obj, ev.Event, strict=False)
    except msgspec.MsgspecError:
        pass
    args = obj.get("args")
    clean = {k: v for k, v in obj.items() if k != "args"}
    if isinstance(args, dict):
        good = {}
        for key, value in args.items():
            try:
                msgspec.convert({key: value}, ev.Args, strict=False)
                good[key] = value
            except msgspec.MsgspecError:
                continue
        clean["args"] = good
    for key in ("ts", "dur"):
        value = clean.get(key)
        if isinstance(value, str):
            try:
                clean[key] = float(value)
            except ValueError:
                return None
    for key in ("ph", "cat", "name", "pid", "tid"):
        if key in clean and not isinstance(clean[key], (str, int)) or isinstance(clean.get(key), bool):
            clean[key] = str(clean[key])
    try:
        return msgspec.convert(clean, ev.Event, strict=False)
    except msgspec.MsgspecError:
        return None
