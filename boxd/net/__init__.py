"""The network rules a task lives by, shared by the manager, which checks a task's hosts when it
is made and gives its worker the proxies' environment, and the broker, whose egress and model
gateway apply them to every connection: the host rules (hosts: a rule's words and canonical
form; host_rules: whether a rule lets a target through), where a task wants to connect
(egress_target), the addresses no task reaches (address_screen), and the worker's proxy
environment (proxy_environment). Standard library only, as the broker imports them. Nothing is
imported here: a package's __init__ is loaded by every import of its modules."""
