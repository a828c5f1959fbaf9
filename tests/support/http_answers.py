"""Reading raw HTTP answers in tests that speak bytes to a door."""


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0
