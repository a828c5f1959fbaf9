"""Reading what callers send: the one JSON reader every door uses (strict_json: no duplicate keys,
no NaN, no deep nesting, a body's size), the caps on every field (caps), the typed reader of the
broker's request bodies without pydantic (json_reader), and the hash that names a JSON value
(canonical_json). Standard library only, as the broker and the MCP relay import them; the
manager's side reads with pydantic models built on these checks (boxd/wire/models/).
Nothing is imported here: a package's __init__ is loaded by every import of its modules."""
