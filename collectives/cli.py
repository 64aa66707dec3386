"""Helpers shared by the command-line tools (tune, simulate, the benchmarks): written once."""


def parse_size(text):
    """Bytes from ``8``, ``4K``, ``16M``, ``1G`` (powers of 1024; a trailing B is allowed)."""
    text = str(text).strip().upper().rstrip("B")
    scale = 1
    for suffix, factor in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if text.endswith(suffix):
            text, scale = text[:-1], factor
    try:
        return int(float(text) * scale)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (bytes, or with K, M or G)") from None
