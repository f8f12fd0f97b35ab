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
# the control sockets are words separated by spaces; on a results stream,
# frames of a 4-byte big-endian length and a JSON object.
#
# What this runtime does not defend: a cell runs in the context's process
# and can rewrite any of it. It can forge its own cell's results (write
# frames on its results stream) or its end (a "done" on its control
# socket), or break its own context; the agent then loses the context (a
# "done" it did not expect), and the daemon bounds and checks whatever
# arrives. What it defends: the zygote and the contexts are not dumpable,
# so no other process of the sandbox can trace them or take their
# descriptors (another context's results stream, the zygote's control
# socket); a child a cell forks never returns into this loop; and every
# frame is bounded before it is written.
import ast
import base64
import builtins
import gc
import io
import json
import linecache
import os
import random
import select
import signal
import socket
import struct
import sys
import time
import traceback
import warnings

MAX_BUNDLES = 64          # display bundles kept per cell (the result besides)
MAX_VALUE = 4 << 20       # one MIME value: characters of text, bytes of an image
MAX_FRAME = 20 << 20      # one frame as written (backend/cellres reads up to 24 MiB)
MAX_CELL_RESULTS = 16 << 20  # bytes of every bundle frame of a cell together
MAX_MSG = 1 << 20         # a control message
MAX_CODE = 4 << 20        # a cell's code
PR_SET_DUMPABLE = 4
# A sandbox restored from another's memory (a gVisor fork with memory)
# finds this file in its /tmp (backend/gvisor's RestoredMarker): every
# copy's contexts hold the same random state until they reseed.
RESTORED_MARKER = "/tmp/.sandbox-restored"
PR_SET_CHILD_SUBREAPER = 36
SPARE_WARM_DELAY = 0.2    # seconds a spare waits before its warm-ups
SPARE_FORK_DELAY = 1.0    # seconds after a hand-out by which the next spare is forked
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
    # This script's memfd, fd 4, is closed: no context's business. A
    # traceback through this script's frames reads its lines from
    # linecache, never from /proc/self/fd/4 (by then another descriptor,
    # maybe a cell's pipe).
    me = sys.argv[0]
    try:
        src = os.pread(4, 1 << 20, 0).decode()
        linecache.cache[me] = (len(src), None, src.splitlines(True), me)
        os.close(4)
    except OSError:
        pass
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        # What a context leaves stays under us; and no process of the
        # sandbox may trace us or take our descriptors (the control
        # socket): the contexts, our forks, inherit that.
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except Exception:
        pass
    for name in filter(None, os.environ.get("SANDBOX_SIDECAR_PRELOAD", "").split(",")):
        try:
            __import__(name)
        except BaseException:  # a module that cannot import is only not preloaded
            pass
    warm_up()
    gc.collect()
    gc.freeze()
    # A child's death wakes the loop (the signal's byte on a pipe): the
    # agent hears how a context died at once, and an idle zygote never
    # wakes up on its own.
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)

    def fork_context():
        """A context, forked ahead: (its pid, our end of its socket)."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in (wake_r, wake_w):
                    os.close(fd)
                ctl.close()
                mine.close()
                if spare[0] is not None:
                    spare[0][1].close()
                context(theirs)
            finally:
                os._exit(0)
        theirs.close()
        return pid, mine

    # One context is always forked ahead, the spare: a new context is
    # handed out at once, so that a context's fork and start (page faults
    # on every page of the interpreter it touches) are not its first
    # cell's. The next spare is forked when the agent says that first
    # cell ended ("spare"), or SPARE_FORK_DELAY after the hand-out if that
    # comes first: its fork would take the CPU (and under gVisor the
    # sentry, ~0.1 s for a zygote that imported pandas) from the first
    # cell. A context asked for before then is forked at once. The spare
    # never ran a cell, and was reseeded at its own fork.
    spare = [None]
    spare[0] = fork_context()
    refork_at = None
    send(ctl, ["ready", sys.version.split()[0]])
    while True:
        reap(ctl, spare)
        if refork_at is not None and time.monotonic() >= refork_at:
            refork_at = None
            if spare[0] is None:
                spare[0] = fork_context()
        wait = None if refork_at is None else max(0.0, refork_at - time.monotonic())
        try:
            ready, _, _ = select.select([ctl, wake_r], [], [], wait)
        except OSError:
            os._exit(0)
        if wake_r in ready:
            try:
                os.read(wake_r, 4096)
            except OSError:
                pass
        if ctl not in ready:
            continue
        try:
            msg, _ = recv(ctl)
        except BlockingIOError:
            continue
        except OSError:
            os._exit(0)
        if msg is None:
            os._exit(0)  # the agent is gone: so is the sandbox
        if msg == ["spare"]:
            refork_at = time.monotonic()  # forked at the loop's top
            continue
        if len(msg) != 2 or msg[0] != "fork":
            continue
        reap(ctl, spare)  # a spare that died is not handed out
        pid, mine = spare[0] if spare[0] is not None else fork_context()
        spare[0] = None
        try:
            send(ctl, ["forked", msg[1], pid], [mine.fileno()])
        except OSError:
            os._exit(0)
        mine.close()
        refork_at = time.monotonic() + SPARE_FORK_DELAY


def reap(ctl, spare):
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if spare[0] is not None and spare[0][0] == pid:
            spare[0][1].close()
            spare[0] = None  # forked again when one is asked for
            continue
        try:
            send(ctl, ["died", pid, status])
        except OSError:
            os._exit(0)


def rehearse(me):
    """Runs a cell's path once, on nothing, before any cell comes (a
    context is forked ahead): the pages of the interpreter that a cell
    touches are copied now, not during the first cell."""
    try:
        cell = Cell(io.BytesIO())
        for code in ("x = 1\nx", "1/0"):
            error = run(code, {"__builtins__": builtins}, 0, {signal.SIGINT}, cell, me)
            cell.frame(encode({"t": "done", "count": 0, "error": error, "dropped": 0}))
    except Exception:
        pass
    linecache.cache.pop("<cell-0>", None)


# Warm-ups: an agent's first use of a module the operator preloads (a
# DataFrame shown, described, grouped, a CSV read), in small steps, on
# data of ours. The zygote runs them once after its imports: what a
# module imports or caches on its first use is done once, shared by every
# fork. The spare runs them again while it waits: Python writes to every
# object it uses (reference counts), so the first use in a fork copies
# every page those objects are on (copy-on-write), a thousand and more
# for pandas; paid ahead, not by its first cell. They run in functions
# of ours, draw no random number and leave no name in a context.
# matplotlib has none: a first figure's cost is its rendering, and a
# rendering in the zygote would leave every context a font file's
# descriptor.
def warm_numpy():
    import numpy as np
    a = np.arange(6.0).reshape(2, 3)
    encode(bundle(a)[0])
    str(a), (a @ a.T).sum(), a.mean(axis=0), a[a > 1].tolist()


def sample_frame():
    import pandas as pd
    return pd.DataFrame({"n": [1, 2, 3], "x": [0.5, 1.5, 2.5], "s": ["a", "b", "a"]})


def warm_pandas_show():
    # As a cell's value or display shows them: text/plain and text/html.
    df = sample_frame()
    encode(bundle(df)[0])
    encode(bundle(df["x"])[0])
    df.shape, df.head(2), df.columns.tolist()


def warm_pandas_describe():
    df = sample_frame()
    encode(bundle(df.describe())[0])
    df.info(buf=io.StringIO())
    repr(df.dtypes), df.isna().sum()


def warm_pandas_compute():
    df = sample_frame()
    df.groupby("s")["x"].sum(), df.sort_values("x"), df[df["n"] > 1]
    df.mean(numeric_only=True), df.assign(y=df["x"] * 2), df["s"].value_counts()


def warm_pandas_csv():
    import pandas as pd
    pd.read_csv(io.StringIO("n,x,s\n1,0.5,a\n2,1.5,b\n"))


# (module, step): a step runs where the module was imported by the
# preloads (numpy by pandas too), in this order.
WARM_UPS = (
    ("numpy", warm_numpy),
    ("pandas", warm_pandas_show),
    ("pandas", warm_pandas_describe),
    ("pandas", warm_pandas_compute),
    ("pandas", warm_pandas_csv),
)


def warm_up(stop=None):
    """Runs the warm-ups of the modules imported; stop, when given, is
    asked before each step and ends them when it says so. A step that
    fails is only not warm (another version of the module)."""
    with warnings.catch_warnings():
        # Ours: no warning printed, and none registered as shown (a
        # cell's first warning still shows).
        warnings.simplefilter("ignore")
        for name, step in WARM_UPS:
            if name not in sys.modules:
                continue
            try:
                if stop is not None and stop():
                    return
                step()
            except Exception:
                pass


def reseed():
    # A fork copies the random generators' state: every context draws
    # its own.
    random.seed(os.urandom(32))
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            np.random.seed(list(struct.unpack("8I", os.urandom(32))))
        except Exception:
            pass
    os.environ["SANDBOX_SIDECAR_CONTEXT_FORKED"] = "1"


def restored():
    """What the restore marker is now (None: there is none): a context
    that finds it changed before a cell was restored into a copy since it
    last reseeded."""
    try:
        st = os.stat(RESTORED_MARKER)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def encode(msg):
    return json.dumps(msg, ensure_ascii=False).encode("utf-8", "replace")


class Cell:
    """What one cell sends on its results stream."""

    def __init__(self, out):
        self.out = out
        self.bundles = 0
        self.bytes = 0
        self.dropped = 0  # bundles left out, and values left out or cut

    def frame(self, data):
        # Whole or not at all: an interrupt never leaves half a frame (the
        # rest of the stream would be unreadable).
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            view = memoryview(struct.pack(">I", len(data)) + data)
            while view:
                view = view[self.out.write(view):]
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def display(self, obj, kind="display"):
        if kind == "display" and self.bundles >= MAX_BUNDLES:
            self.dropped += 1  # before any repr: 10,000 displays cost little
            return
        data, cut = bundle(obj)
        self.dropped += cut
        frame = encode({"t": kind, "data": data})
        if len(frame) > MAX_FRAME or self.bytes + len(frame) > MAX_CELL_RESULTS:
            self.dropped += 1
            return
        self.bundles += kind == "display"
        self.bytes += len(frame)
        self.frame(frame)


def bundle(obj):
    """obj's MIME bundle, as IPython's display protocol makes it, and how
    many of its values were left out or cut (past MAX_VALUE: text/plain
    keeps its first MAX_VALUE characters, any other is left out)."""
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
    out, cut = {}, 0
    for mime, v in data.items():
        if mime in BINARY:
            if isinstance(v, str):
                v = v.encode("latin-1", "replace")
            if not isinstance(v, (bytes, bytearray, memoryview)):
                continue
            if len(v) > MAX_VALUE:  # measured before it is encoded
                cut += 1
                continue
            v = base64.b64encode(bytes(v)).decode()
        elif mime == "application/json":
            try:
                if len(json.dumps(v)) > MAX_VALUE:
                    cut += 1
                    continue
            except Exception:
                continue
        elif isinstance(v, (bytes, bytearray)):
            if len(v) > 4 * MAX_VALUE:
                v = bytes(v[:4 * MAX_VALUE])
            v = bytes(v).decode("utf-8", "replace")
        elif not isinstance(v, str):
            try:
                v = str(v)
            except Exception:
                continue
        if isinstance(v, str) and len(v) > MAX_VALUE:
            cut += 1
            if mime != "text/plain":
                continue
            v = v[:MAX_VALUE]
        out[mime] = v
    if not isinstance(out.get("text/plain"), str):
        out["text/plain"] = "<%s>" % type(obj).__name__
    return out, cut


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
    except Exception as e:
        cell.display(Text("<figure not rendered: %s>" % e))
    finally:
        try:
            plt.close("all")
        except Exception:
            pass


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
    me = os.getpid()
    try:
        os.setsid()  # a group of its own: what it leaves ends with it
    except OSError:
        pass
    reseed()
    seeded = restored()
    rehearse(me)
    # Until a cell comes: a cell's first use of the preloaded modules,
    # paid now (the zygote's warm-ups again, their pages copied), and
    # what they made collected. Not at once: a spare is forked as the
    # context before it ends its first cell, and that context's next cell
    # often follows within milliseconds, while an agent's next new
    # context comes seconds later. A cell that comes meanwhile ends them.
    try:
        if not select.select([ctl], [], [], SPARE_WARM_DELAY)[0]:
            warm_up(lambda: select.select([ctl], [], [], 0)[0])
            gc.collect()
    except OSError:
        pass
    ns = {"__name__": "__main__", "__builtins__": builtins}
    count = 0
    current = [None]

    def display(*objs, **_):
        for obj in objs:
            if current[0] is not None:
                current[0].display(obj)

    builtins.display = display
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
        if restored() != seeded:
            # Restored into a copy of the sandbox (this context, or the
            # spare it was, with it): draw apart from the other copies.
            reseed()
            seeded = restored()
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
        error = None
        try:
            error = run(code, ns, count, block, cell, me)
        except BaseException as e:  # an interrupt in our own code
            error = describe(e)
        finally:
            sys.stdout, sys.stderr = saved
            current[0] = None
            # The process's own descriptors 1 and 2 (a subprocess's, a C
            # library's) go back to /dev/null: the cell's pipes close. (A
            # /dev/null of each cell's: the cell may have closed any.)
            try:
                null = os.open(os.devnull, os.O_RDWR)
                os.dup2(null, 1)
                os.dup2(null, 2)
                if null > 2:
                    os.close(null)
            except OSError:
                pass
        for f in (stdout, stderr):
            try:
                f.flush()
            except Exception:
                pass
            try:
                f.close()
            except Exception:
                pass
        try:
            cell.frame(encode({"t": "done", "count": count, "error": error, "dropped": cell.dropped}))
        except Exception:
            pass
        try:
            results.close()
        except Exception:
            pass
        try:
            send(ctl, ["done", count])
        except OSError:
            os._exit(0)


def run(code, ns, count, block, cell, me):
    """Runs one cell: every statement, then the last one's value when it is
    an expression, as a notebook shows it; then the open figures and that
    value go to cell. Returns its error (or None). The cell's interrupt
    (SIGINT) is unblocked throughout: a value whose repr never ends is
    interrupted like the code that made it."""
    name = "<cell-%d>" % count
    # Tracebacks show the cell's lines, as a notebook's do.
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    try:
        tree = ast.parse(code, name, "exec")
    except SyntaxError as e:
        return describe(e)
    except (ValueError, MemoryError, RecursionError) as e:  # a NUL byte, a tree too deep
        return describe(e)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    error, value = None, None
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, block)
        try:
            try:
                exec(compile(tree, name, "exec"), ns)
                value = eval(compile(last, name, "eval"), ns) if last is not None else None
            except BaseException as e:
                error = describe(e, skip=1)
            if os.getpid() != me:
                # A child the cell forked that came back out of its code:
                # it is no context, and must not answer for one.
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(0)
            if value is not None:
                ns["_"] = value
            try:
                figures(cell)  # after an error too, as a notebook shows them
                if value is not None:
                    cell.display(value, "result")
            except BaseException as e:  # an interrupt in a repr, a closed stream
                error = error or describe(e)
        finally:
            signal.pthread_sigmask(signal.SIG_BLOCK, block)
    finally:
        # An interrupt that came after the cell's code ended (it is blocked
        # now) is consumed here, not left for the next cell.
        if signal.SIGINT in signal.sigpending():
            signal.sigwait(block)
    return error


def describe(e, skip=0):
    tb = e.__traceback__
    for _ in range(skip):
        if tb is not None:
            tb = tb.tb_next
    if isinstance(e, SyntaxError):
        lines = traceback.format_exception_only(type(e), e)  # the cell's line, as a notebook shows it
    else:
        lines = traceback.format_exception(type(e), e, tb)
    # Bounded, so that the cell's last frame always fits what its reader
    # keeps (backend/cellres).
    return {"name": type(e).__name__[:200], "value": str(e)[:16384], "traceback": [l[:4096] for l in lines[-50:]]}


if __name__ == "__main__":
    zygote()
