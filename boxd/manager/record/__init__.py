"""The box's record: one SQLite database on a thread of its own (store, ledger, group commit), the
tasks as recorded, what is flushed before it is logged, and the disk room the record keeps back."""
