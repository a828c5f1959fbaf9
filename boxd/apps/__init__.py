"""The apps boxd ships: real tools that tests and the demo use."""
