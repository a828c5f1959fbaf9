"""The D-Bus API: interface definitions, the server-side dispatch with polkit, and the client."""
