#!/usr/bin/env python3
"""Draws the README's veth benchmark table as an SVG bar chart (benches/veth.svg).

The numbers are the README's table (two full runs of benches/veth/run.sh): edit both together.
    python3 benches/chart.py
"""
from pathlib import Path

# (switch, delivered Kpps at saturation in run 1, run 2)
RUNS = [
    ("wasmswitch cross (ceiling)", 846, 834),
    ("wasmswitch l2", 846, 812),
    ("Open vSwitch 3.1 afxdp", 805, 818),
    ("Linux bridge", 716, 498),
]

W, ROW, LEFT, TOP, SCALE = 640, 34, 210, 40, 0.45


def svg() -> str:
    h = TOP + ROW * len(RUNS) + 30
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" font-family="sans-serif" font-size="12">',
        f'<text x="{LEFT}" y="20" font-size="13">Delivered at saturation, Kpps (veth, 2 cores; two runs)</text>',
    ]
    for i, (name, a, b) in enumerate(RUNS):
        y = TOP + i * ROW
        out.append(f'<text x="{LEFT - 8}" y="{y + 15}" text-anchor="end">{name}</text>')
        for j, (v, colour) in enumerate(((a, "#3b6ea5"), (b, "#8fb3d9"))):
            yy = y + j * 12
            out.append(f'<rect x="{LEFT}" y="{yy}" width="{v * SCALE:.0f}" height="11" fill="{colour}"/>')
            out.append(f'<text x="{LEFT + v * SCALE + 4:.0f}" y="{yy + 10}" font-size="10">{v}</text>')
    out.append(f'<text x="{LEFT}" y="{h - 8}" font-size="10">dark: run 1, light: run 2. Generator on CPU 0, switch on CPU 1.</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 1:
        # It takes no options: anything given (--help included) gets the usage, nothing written.
        print(__doc__.strip())
        sys.exit(0 if sys.argv[1] in ("-h", "--help") else 2)
    path = Path(__file__).with_name("veth.svg")
    path.write_text(svg())
    print(path)
