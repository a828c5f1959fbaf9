"""The test machine's harness: a Debian image, systemd-nspawn machines booted from it with boxd
installed, and the stand-ins that VM tests, `make run` and `bench/` drive it with (an outside
world, a model upstream, an npm registry, an SMTP server, a browser). Not part of boxd's wheel."""
