"""The "outside world" of a test machine: a network namespace of its own, joined to the machine
by a veth pair, with real HTTP and HTTPS servers and a UDP listener, and names in /etc/hosts.
Never the real internet: test machines boot with a private network.

    outside   198.18.0.2 and 2001:2::2, the public face (namespace `outside`); the machine is
              198.18.0.1 and 2001:2::1. Also 10.77.0.2 and fd77::2, a private network's
              addresses (the machine: 10.77.0.1, fd77::1), and 169.254.77.2, a link-local
              neighbour (the machine: 169.254.77.1).
    HTTP on 80 and 8080, HTTPS on 443 (a self-signed certificate the machine trusts), UDP on 53
    names: allowed.test other.test wild.test www.wild.test -> 198.18.0.2; private.test ->
           10.77.0.2; sneaky.test -> 127.0.0.1; and PRIVATE_NAMES, names of addresses nothing
           here has, which egress must refuse before it connects

The public face is in the benchmarking blocks (198.18.0.0/15, 2001:2::/48): egress lets a name
resolve there, as it does to any public address, while it refuses a name that resolves to a
private one (boxd/net/address_screen.py). Each server answers `hello from PORT PATH` and
appends what it got to a log file, so a test can assert that something never arrived.
"""

import time

from testbed.machine import Machine, MachineProcess

NAMESPACE = "outside"
ADDRESS = "198.18.0.2"
ADDRESS6 = "2001:2::2"
PRIVATE_ADDRESS = "10.77.0.2"
PRIVATE_ADDRESS6 = "fd77::2"
LINK_LOCAL_ADDRESS = "169.254.77.2"
NAMES = ("allowed.test", "other.test", "wild.test", "www.wild.test")
# The scripted model's name (testbed/model_server.py): the certificate covers it too.
MODEL_NAME = "model.test"
PRIVATE_NAME = "private.test"
LOOPBACK_NAME = "sneaky.test"
# Names of addresses egress refuses; no namespace has them, and no connection is ever tried.
PRIVATE_NAMES = {
    "rfc1918-a.test": "10.1.2.3",
    "rfc1918-b.test": "192.168.1.1",
    "rfc1918-c.test": "172.16.0.1",
    "cgnat.test": "100.64.0.1",
    "ula.test": "fd00::1",
    "multicast.test": "224.0.0.1",
    "mapped.test": "::ffff:10.0.0.1",
    "metadata.test": "169.254.169.254",
    "metadata6.test": "fd00:ec2::254",
}
DIR = "/run/outside"
LOG = f"{DIR}/arrived.log"

SERVER = f"""
import socket, ssl, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG = {LOG!r}
lock = threading.Lock()


def note(line):
    with lock, open(LOG, "a") as f:
        f.write(line + "\\n")


class Hello(BaseHTTPRequestHandler):
    def do_GET(self):
        port = self.server.server_address[1]
        note(f"tcp {{port}} {{self.headers.get('Host')}} {{self.path}}")
        body = f"hello from {{port}} {{self.path}}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class DualStack(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def serve(port, tls=False):
    server = DualStack(("::", port), Hello)
    if tls:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain("{DIR}/cert.pem", "{DIR}/key.pem")
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def udp():
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.bind(("::", 53))
    while True:
        data, peer = sock.recvfrom(2048)
        note(f"udp 53 {{peer[0]}} {{len(data)}} bytes")


serve(80)
serve(8080)
serve(443, tls=True)
note("ready")
udp()
"""

_PRIVATE_HOSTS_LINES = "".join(
    f"echo '{address} {name}' >> /etc/hosts\n" for name, address in PRIVATE_NAMES.items()
)

SETUP = f"""
set -e
ip netns add {NAMESPACE}
ip link add box-out type veth peer name out0 netns {NAMESPACE}
ip addr add 198.18.0.1/24 dev box-out
ip addr add 10.77.0.1/24 dev box-out
ip addr add 169.254.77.1/24 dev box-out
ip -6 addr add 2001:2::1/64 dev box-out nodad
ip -6 addr add fd77::1/64 dev box-out nodad
ip link set box-out up
ip -n {NAMESPACE} addr add {ADDRESS}/24 dev out0
ip -n {NAMESPACE} addr add {PRIVATE_ADDRESS}/24 dev out0
ip -n {NAMESPACE} addr add {LINK_LOCAL_ADDRESS}/24 dev out0
ip -n {NAMESPACE} -6 addr add {ADDRESS6}/64 dev out0 nodad
ip -n {NAMESPACE} -6 addr add {PRIVATE_ADDRESS6}/64 dev out0 nodad
ip -n {NAMESPACE} link set out0 up
ip -n {NAMESPACE} link set lo up
mkdir -p {DIR}
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=boxd-test-outside \\
    -addext "subjectAltName={",".join(f"DNS:{n}" for n in (*NAMES, MODEL_NAME))}" \\
    -keyout {DIR}/key.pem -out {DIR}/cert.pem 2>/dev/null
cp {DIR}/cert.pem /usr/local/share/ca-certificates/boxd-test-outside.crt
update-ca-certificates >/dev/null
echo "{ADDRESS} {" ".join((*NAMES, MODEL_NAME))}" >> /etc/hosts
echo "{PRIVATE_ADDRESS} {PRIVATE_NAME}" >> /etc/hosts
echo "127.0.0.1 {LOOPBACK_NAME}" >> /etc/hosts
{_PRIVATE_HOSTS_LINES}"""


def ensure_outside(machine: Machine) -> None:
    """Makes the outside world's namespace, addresses and names in the machine, once."""
    if NAMESPACE not in machine.run("ip", "netns", "list").stdout.split():
        machine.run("sh", "-c", SETUP)


def start_outside(machine: Machine) -> MachineProcess:
    """Makes the outside world in the machine (once) and starts its servers."""
    ensure_outside(machine)
    machine.run("tee", f"{DIR}/server.py", input=SERVER)
    machine.run("rm", "-f", LOG)
    server = machine.spawn("ip", "netns", "exec", NAMESPACE, "python3", f"{DIR}/server.py")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if "ready" in arrived(machine):
            return server
        time.sleep(0.1)
    server.kill()
    raise AssertionError("the outside world's servers did not start")


def arrived(machine: Machine) -> str:
    """What the outside world's servers have received so far, one line each."""
    return machine.run("cat", LOG, check=False).stdout
