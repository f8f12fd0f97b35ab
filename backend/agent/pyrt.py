# The Python side of a sandbox's code contexts (run_code), run by the
# sandbox's agent with the image's python3. One process, the zygote, imports
# the modules the operator preloads and then only forks: it never runs guest
# code. Each context is a fork of it, which runs the cells of one context
# name, keeping their variables. Everything here runs as the guest; what it
# sends is checked by the agent and the daemon as hostile.
#
# Descriptors: the zygote gets its control socket as fd 3 (seqpacket, to the
# agent). A context gets its own control socket from the zygote; with each
# cell the agent hands it the cell's stdout and stderr pipes and its results
# stream (the daemon reads all three), and its code in a memfd. Messages on
# the control sockets are
# JSON objects; on a results stream, frames of a 4-byte big-endian length
# and a JSON object.
import ast
import base64
import builtins
import gc
import io
import json
import linecache
import os
import random
import signal
import socket
import struct
import sys
import traceback

MAX_BUNDLES = 64          # display bundles kept per cell (the result besides)
MAX_VALUE = 4 << 20       # bytes of one MIME value
MAX_CELL_RESULTS = 16 << 20  # bytes of every bundle of a cell together
MAX_MSG = 1 << 20         # a control message
MAX_CODE = 4 << 20        # a cell's code
BINARY = ("image/png", "image/jpeg")
REPRS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_json_", "application/json"),
    ("_repr_latex_", "text/latex"),
)


def send(sock, words, fds=()):
    """A control message: words separated by spaces (names are letters,
    digits, '.', '_' and '-')."""
    data = " ".join(str(w) for w in words).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def recv(sock, maxfds=0):
    if maxfds:
        data, fds, _, _ = socket.recv_fds(sock, MAX_MSG, maxfds)
    else:
        data, fds = sock.recv(MAX_MSG), []
    if not data:
        return None, fds
    return data.decode("ascii", "replace").split(), fds


def zygote():
    ctl = socket.socket(fileno=3)
    try:
        import ctypes
        # PR_SET_CHILD_SUBREAPER: what a context leaves stays under us.
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
    except Exception:
        pass
    for name in filter(None, os.environ.get("SANDBOX_SIDECAR_PRELOAD", "").split(",")):
        try:
            __import__(name)
        except BaseException:  # a module that cannot import is only not preloaded
            pass
    gc.collect()
    gc.freeze()
    send(ctl, ["ready", sys.version.split()[0]])
    ctl.settimeout(0.2)
    while True:
        reap(ctl)
        try:
            msg, _ = recv(ctl)
        except socket.timeout:
            continue
        except OSError:
            os._exit(0)
        if msg is None:
            os._exit(0)  # the agent is gone: so is the sandbox
        if len(msg) != 2 or msg[0] != "fork":
            continue
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                ctl.close()
                mine.close()
                context(theirs)
            finally:
                os._exit(0)
        theirs.close()
        send(ctl, ["forked", msg[1], pid], [mine.fileno()])
        mine.close()


def reap(ctl):
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send(ctl, ["died", pid, status])


def reseed():
    # A fork copies the random generators' state: every context draws
    # its own.
    random.seed(os.urandom(32))
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            np.random.seed(int.from_bytes(os.urandom(4), "little"))
        except Exception:
            pass
    os.environ["SANDBOX_SIDECAR_CONTEXT_FORKED"] = "1"


class Cell:
    """What one cell sends on its results stream."""

    def __init__(self, out):
        self.out = out
        self.bundles = 0
        self.bytes = 0
        self.dropped = 0

    def frame(self, msg):
        data = json.dumps(msg).encode()
        self.out.write(struct.pack(">I", len(data)) + data)
        self.out.flush()

    def display(self, obj, kind="display"):
        data = bundle(obj)
        size = sum(len(v) if isinstance(v, str) else len(json.dumps(v)) for v in data.values())
        if kind == "display" and self.bundles >= MAX_BUNDLES or self.bytes + size > MAX_CELL_RESULTS:
            self.dropped += 1
            return
        self.bundles += kind == "display"
        self.bytes += size
        self.frame({"t": kind, "data": data})


def bundle(obj):
    """obj's MIME bundle, as IPython's display protocol makes it."""
    data = {}
    try:
        m = getattr(obj, "_repr_mimebundle_", None)
        if callable(m) and not isinstance(obj, type):
            r = m(include=None, exclude=None)
            if isinstance(r, tuple):
                r = r[0]
            if isinstance(r, dict):
                data.update({k: v for k, v in r.items() if isinstance(k, str)})
    except Exception:
        pass
    for meth, mime in REPRS:
        if mime in data or isinstance(obj, type):
            continue
        try:
            f = getattr(obj, meth, None)
            v = f() if callable(f) else None
        except Exception:
            v = None
        if isinstance(v, tuple):
            v = v[0]
        if v is not None:
            data[mime] = v
    if "text/plain" not in data:
        try:
            data["text/plain"] = repr(obj)
        except Exception as e:
            data["text/plain"] = "<unrepresentable %s: %s>" % (type(obj).__name__, e)
    out = {}
    for mime, v in data.items():
        if mime in BINARY:
            if isinstance(v, str):
                v = v.encode("latin-1", "replace")
            if isinstance(v, (bytes, bytearray, memoryview)):
                v = base64.b64encode(bytes(v)).decode()
            else:
                continue
        elif mime == "application/json":
            try:
                json.dumps(v)
            except Exception:
                continue
        elif isinstance(v, (bytes, bytearray)):
            v = bytes(v).decode("utf-8", "replace")
        elif not isinstance(v, str):
            v = str(v)
        if isinstance(v, str) and len(v) > MAX_VALUE:
            v = v[:MAX_VALUE] if mime not in BINARY else None
            if v is None:
                continue
        out[mime] = v
    return out


def figures(cell):
    """Open matplotlib figures become PNG bundles, as a notebook's inline
    backend shows them, and are closed."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        for num in plt.get_fignums():
            fig = plt.figure(num)
            buf = io.BytesIO()
            fig.savefig(buf, format="png", bbox_inches="tight")
            cell.display(Png(buf.getvalue(), repr(fig)))
        plt.close("all")
    except Exception as e:
        cell.display(Text("<figure not rendered: %s>" % e))


class Png:
    def __init__(self, data, text):
        self.data, self.text = data, text

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"image/png": self.data, "text/plain": self.text}


class Text:
    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


def context(ctl):
    reseed()
    ns = {"__name__": "__main__", "__builtins__": builtins}
    count = 0
    current = [None]

    def display(*objs, **_):
        for obj in objs:
            if current[0] is not None:
                current[0].display(obj)

    builtins.display = display
    devnull = os.open(os.devnull, os.O_RDWR)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    block = {signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, block)
    while True:
        try:
            msg, fds = recv(ctl, 4)
        except OSError:
            os._exit(0)
        if msg is None:
            os._exit(0)
        if msg != ["run"] or len(fds) != 4:
            for fd in fds:
                os.close(fd)
            continue
        count += 1
        out_fd, err_fd, res_fd, code_fd = fds
        try:
            code = os.pread(code_fd, MAX_CODE, 0).decode("utf-8", "replace")
        finally:
            os.close(code_fd)
        results = io.FileIO(res_fd, "w", closefd=True)
        cell = Cell(results)
        current[0] = cell
        # The cell's pipes are descriptors 1 and 2 too while it runs, so
        # what a subprocess or a C library writes there is the cell's.
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        stdout = io.TextIOWrapper(io.FileIO(out_fd, "w", closefd=True), encoding="utf-8", errors="replace", line_buffering=True)
        stderr = io.TextIOWrapper(io.FileIO(err_fd, "w", closefd=True), encoding="utf-8", errors="replace", line_buffering=True)
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = stdout, stderr
        error, value = None, None
        try:
            error, value = run(code, ns, count, block)
            figures(cell)
            if value is not None:
                cell.display(value, "result")
        except BaseException as e:  # an interrupt in our own code
            error = describe(e)
        finally:
            sys.stdout, sys.stderr = saved
            current[0] = None
            # The process's own descriptors 1 and 2 (a subprocess's, a C
            # library's) go back to /dev/null: the cell's pipes close.
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
        for f in (stdout, stderr):
            try:
                f.flush()
                f.close()
            except Exception:
                pass
        try:
            cell.frame({"t": "done", "count": count, "error": error, "dropped": cell.dropped})
            results.close()
        except Exception:
            pass
        try:
            send(ctl, ["done", count])
        except OSError:
            os._exit(0)


def run(code, ns, count, block):
    """Runs one cell: every statement, then the last one's value when it is
    an expression, as a notebook shows it. Returns its error (or None) and
    that value (or None)."""
    name = "<cell-%d>" % count
    # Tracebacks show the cell's lines, as a notebook's do.
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    try:
        tree = ast.parse(code, name, "exec")
    except SyntaxError as e:
        return describe(e), None
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    value = None
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, block)
        try:
            exec(compile(tree, name, "exec"), ns)
            value = eval(compile(last, name, "eval"), ns) if last is not None else None
        finally:
            signal.pthread_sigmask(signal.SIG_BLOCK, block)
    except BaseException as e:
        return describe(e, skip=1), None
    finally:
        # An interrupt that came after the cell's code ended (it is blocked
        # now) is consumed here, not left for the next cell.
        if signal.SIGINT in signal.sigpending():
            signal.sigwait(block)
    if value is not None:
        ns["_"] = value
    return None, value


def describe(e, skip=0):
    tb = e.__traceback__
    for _ in range(skip):
        if tb is not None:
            tb = tb.tb_next
    lines = traceback.format_exception(type(e), e, tb)
    # Bounded, so that the cell's last frame always fits what its reader
    # keeps (backend/cellres).
    return {"name": type(e).__name__[:200], "value": str(e)[:16384], "traceback": [l[:4096] for l in lines[-50:]]}


if __name__ == "__main__":
    zygote()
