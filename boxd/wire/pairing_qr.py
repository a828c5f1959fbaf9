"""The pairing code as a QR code, for a phone's camera: an SVG for the screen (the answer of
`POST /api/pairings`) and block characters for `boxctl pair` in a terminal.

The QR encodes exactly the code's text, nothing else: a device's pairing screen reads it as it
would read it typed in. segno (pure Python, no dependencies) draws it.
"""

import io

import segno

# Medium error correction: a code shown on a screen is read whole, but a glare or a scratched
# phone screen should not stop it.
_ERROR = "m"


def _qr(code: str) -> segno.QRCode:
    # make_qr: a regular QR code; a Micro QR code (segno's choice for short text) is one most
    # phone cameras do not read.
    return segno.make_qr(code, error=_ERROR)


def qr_svg(code: str) -> str:
    """An SVG document with a viewBox and no fixed size, dark on a light ground whatever the
    page's colours, so it scales to where the screen puts it and stays scannable. It carries
    its namespace: the screen shows it as an image, where an SVG without one draws nothing."""
    out = io.BytesIO()
    _qr(code).save(
        out,
        kind="svg",
        xmldecl=False,
        svgns=True,
        nl=False,
        omitsize=True,
        border=4,
        dark="#000",
        light="#fff",
    )
    return out.getvalue().decode()


def qr_text(code: str) -> str:
    """The QR code in block characters, two rows of modules to a line."""
    out = io.StringIO()
    _qr(code).terminal(out=out, compact=True)
    return out.getvalue().rstrip("\n")
