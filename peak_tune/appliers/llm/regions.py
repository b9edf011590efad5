"""The regions a pass edits (the PEAK paper's spatial decomposition): the macros (the
preprocessor block at the top of the source: guards of the tuning parameters, derived
macros, includes) and the device code (everything from the first line of code on). A
launch pass edits the launch geometry, which is not in the source.

A code pass is asked for its region alone and the other is kept byte for byte. Models
often send the whole source back anyway: that is accepted when the region it must not
touch is unchanged, and refused (ScopeError, sent back as a repair) when it changed.
"""

from __future__ import annotations

from typing import NamedTuple

from .errors import ScopeError

__all__ = ["Regions", "first_code_line", "merge_reply", "split"]


class Regions(NamedTuple):
    macros: str  # "" when the source starts with code
    device: str


def split(source: str) -> Regions:
    """The source's macros region (leading directives, comments and blank lines, with
    `\\` continuations) and the rest."""
    lines = source.splitlines(keepends=True)
    at, in_comment, continued = 0, False, False
    for at, line in enumerate(lines):  # noqa: B007 (at is the first device line)
        text = line.strip()
        if in_comment:
            in_comment = "*/" not in text
            continue
        if continued:
            continued = text.endswith("\\")
            continue
        if not text or text.startswith("//"):
            continue
        if text.startswith("/*"):
            in_comment = "*/" not in text[2:]
            continue
        if text.startswith("#"):
            continued = text.endswith("\\")
            continue
        break
    else:
        return Regions(source, "")
    return Regions("".join(lines[:at]), "".join(lines[at:]))


def first_code_line(source: str) -> str:
    """The device region's first line (how a prompt names where it starts)."""
    device = split(source).device
    return device.splitlines()[0].strip() if device.strip() else ""


def merge_reply(current: str, region: str, reply: str) -> str:
    """The source after a `region` ("macros" or "device") pass whose reply's code is
    `reply`: the region alone, or the whole source with the other region unchanged."""
    kept = split(current)
    sent = split(reply)
    if region == "macros":
        if not sent.device.strip():
            return _joined(reply, kept.device)
        if _same(sent.device, kept.device):
            return _joined(sent.macros, kept.device)
        raise ScopeError("the macros pass changed the device code: reply with the macros "
                         "region alone (the preprocessor lines above the code)")
    if not _directives(sent.macros):
        return _joined(kept.macros, reply)
    if _same(sent.macros, kept.macros):
        return _joined(kept.macros, sent.device)
    guards = [line for line in kept.macros.splitlines() if line.strip().startswith("#ifndef")]
    if guards and all(g in sent.macros for g in guards):
        raise ScopeError("the device pass changed the macros region: reply with the device "
                         "code alone (from its first line of code on), the macros above it "
                         "stay as they are")
    return _joined(kept.macros, reply)  # device code that opens with its own directives


def _directives(text: str) -> bool:
    return any(line.strip().startswith("#") for line in text.splitlines())


def _same(a: str, b: str) -> bool:
    return a.split() == b.split()


def _joined(macros: str, device: str) -> str:
    """The two regions as one source: each as given, byte for byte."""
    if not macros.strip():
        return device
    return (macros if macros.endswith("\n") else macros + "\n") + device
