"""The evaluation harness every backend shares: inputs no kernel can predict, checks it
cannot reach, timing policy, plausibility and isolation. A backend supplies only compile,
load, launch, memory and its vendor call."""
