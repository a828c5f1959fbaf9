"""The dark modules of a QR code drawn by segno as an SVG."""

import re


def dark_modules(svg: str) -> set[tuple[int, int]]:
    """The dark modules an SVG of segno's draws: `M x y` and `m dx dy` move, `h n` draws n
    modules to the right (on a line half a module below the row's top)."""
    path = svg.split('class="qrline"')[1].split(' d="')[1].split('"')[0]
    dark: set[tuple[int, int]] = set()
    x = y = 0.0
    for kind, first, second in re.findall(r"([Mmh])(-?[\d.]+)(?: (-?[\d.]+))?", path):
        if kind == "M":
            x, y = float(first), float(second)
        elif kind == "m":
            x, y = x + float(first), y + float(second)
        else:
            dark.update((int(x) + i, int(y)) for i in range(int(float(first))))
            x += float(first)
    return dark
