"""What boxd's processes say to each other and to their callers: the words on the wire.

In two halves, and the line between them is boxd's rule of weight: **a task's broker never
imports pydantic, nor a task's model.** A broker starts with every task and again on the first
request after it exited idle, so everything it imports is paid by every task, each time
(tests/test_broker_imports.py checks what a broker loads; tests/test_import_direction.py that
the halves stay apart).

- Here, `boxd/wire/*.py`: plain Python, standard library only but for the QR code's drawer
  (segno, in pairing_qr, which no broker imports). A broker may import any of these: an approval's
  question and states (approval), a step (step), the kinds of log events (event), who is calling
  (caller), task ids (ids), the model names (claude_models), the model key's vault names
  (model_key), whose each vault secret is (secret_names) and reading them as systemd hands them
  to a process (credentials), model prices (pricing), a task's spending limit (task_budget), the
  pairing code as a QR code (pairing_qr), how a broker and an app's runner talk (app_runner), the
  worker table and the signals that wake a worker started ahead (worker_kinds), and the link
  `boxctl open` prints for the screen (screen_link).
- `boxd/wire/models/`: the pydantic models, and what is built on them, for the manager, the
  gateway and boxctl: a task and its request, its diff, its records, settings, the owner's
  request bodies, tokens' limits, what a key was used for, and pydantic's errors in plain words.
  They check their fields with the plain checks of boxd/reading/, so both halves say the same.

Nothing is imported here, nor in models/__init__.py: a package's __init__ is loaded by every
import of its modules, and what it imported would be in every broker.
"""
