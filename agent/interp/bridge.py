# The Python bridge of forkbox-agent's code interpreter (package interp).
#
# The agent runs it as the session's user, one per Python context. It
# starts one IPython kernel (ipykernel, through jupyter_client) over the ipc
# transport in a private directory, and speaks JSON lines with the agent:
#
#   agent -> bridge (stdin):  {"op": "execute", "id", "code", "env_vars", "seed"}
#                             {"op": "interrupt", "id"} (the cell's id)
#   bridge -> agent (stdout): {"type": "ready", "kernel_pid"} once started,
#                             then per cell the output lines of E2B's
#                             /execute stream (stdout, stderr, result,
#                             error, number_of_executions) and
#                             {"type": "end_of_execution"} last.
#
# The kernel's own stdin and stdout are /dev/null and its stderr is the
# bridge's (the agent's log), so nothing the cell writes reaches this
# protocol but what the kernel publishes. When the kernel dies the bridge
# reports an error, ends the cell and exits; the agent starts a new one.
import glob
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from jupyter_client import KernelManager

# A stream message is cut into lines of at most this many characters, so
# one line stays small whatever a cell prints.
CHUNK = 32 * 1024

# Kernel start-up code: the chart formatter (a figure's E2B chart JSON
# under the "e2b/chart" MIME type) and the helpers that set and restore a
# call's environment variables. Run silently once the kernel is ready.
SETUP = r'''
def __forkbox_setup(CHARTS_SOURCE):
    import os as _os
    _ip = get_ipython()

    def _env_apply(pairs):
        saved = {}
        for k, v in pairs.items():
            saved[k] = _os.environ.get(k)
            _os.environ[k] = v
        return saved

    def _env_restore(saved):
        for k, v in saved.items():
            if v is None:
                _os.environ.pop(k, None)
            else:
                _os.environ[k] = v

    _ip.user_ns['__forkbox_env_apply'] = _env_apply
    _ip.user_ns['__forkbox_env_restore'] = _env_restore
    _ip.user_ns_hidden['__forkbox_env_apply'] = _env_apply
    _ip.user_ns_hidden['__forkbox_env_restore'] = _env_restore

    try:
        import matplotlib.figure
    except ImportError:
        return
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    class _ChartFormatter(BaseFormatter):
        format_type = Unicode('e2b/chart')
        print_method = ObjectName('_repr_e2b_chart_')

        def __call__(self, obj):
            # Not through for_type: the inline backend drops Figure
            # printers when pyplot is first imported.
            if not isinstance(obj, matplotlib.figure.Figure):
                return None
            try:
                return charts.figure_chart(obj)
            except Exception:
                return None

    fmt = _ChartFormatter(parent=_ip.display_formatter)
    _ip.display_formatter.formatters['e2b/chart'] = fmt
    if 'e2b/chart' not in _ip.display_formatter.active_types:
        _ip.display_formatter.active_types.append('e2b/chart')

    import sys as _sys
    import types as _types
    charts = _types.ModuleType('forkbox_charts')
    exec(compile(CHARTS_SOURCE, '<forkbox_charts>', 'exec'), charts.__dict__)
    _sys.modules['forkbox_charts'] = charts

__forkbox_setup(CHARTS_SOURCE)
del __forkbox_setup
'''



def stale_kernel_alive(d):
    """Reports whether private directory d may still be in use: its pid
    file (written by the bridge that made d once its kernel was ready)
    names a live process, or it has none yet and is younger than ten
    minutes (a bridge still starting)."""
    try:
        with open(os.path.join(d, 'kernel.pid')) as f:
            os.kill(int(f.read().strip()), 0)
        return True
    except FileNotFoundError:
        try:
            return time.time() - os.stat(d).st_mtime < 600
        except OSError:
            return False
    except (OSError, ValueError):
        return False


def emit(obj):
    """Writes one protocol line to the agent."""
    sys.stdout.write(json.dumps(obj, separators=(',', ':'), default=str) + '\n')
    sys.stdout.flush()


def stamp(msg):
    d = msg.get('header', {}).get('date')
    if hasattr(d, 'isoformat'):
        return d.isoformat()
    return d or time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())


def result_line(data, main):
    """Maps an IPython MIME bundle to an E2B result line."""
    data = dict(data)
    out = {'type': 'result', 'is_main_result': main}
    text = data.pop('text/plain', None)
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in '\'"':
        text = text[1:-1]
    if text is not None:
        out['text'] = text
    for mime, key in (('text/html', 'html'), ('text/markdown', 'markdown'),
                      ('image/svg+xml', 'svg'), ('image/png', 'png'),
                      ('image/jpeg', 'jpeg'), ('application/pdf', 'pdf'),
                      ('text/latex', 'latex'), ('application/json', 'json'),
                      ('application/javascript', 'javascript'),
                      ('e2b/data', 'data'), ('e2b/chart', 'chart')):
        if mime in data:
            out[key] = data.pop(mime)
    if data:
        out['extra'] = data
    return out


class Bridge:
    def __init__(self, cwd, charts):
        # Directories of earlier bridges of this user that were killed
        # before they could clean up (the agent kills with SIGKILL) and
        # whose kernel is gone: removed, as /dev/shm counts against the
        # sandbox's memory.
        for old in glob.glob('/dev/shm/forkbox-kernel-*') + glob.glob(os.path.join(tempfile.gettempdir(), 'forkbox-kernel-*')):
            try:
                if os.stat(old).st_uid == os.getuid() and not stale_kernel_alive(old):
                    shutil.rmtree(old, ignore_errors=True)
            except OSError:
                pass
        # The kernel's sockets live in memory (/dev/shm) when the sandbox
        # has it: gVisor cannot checkpoint a unix socket bound on a
        # filesystem its gofer serves (/tmp), so a memory snapshot of a
        # sandbox with a kernel needs them there.
        shm = '/dev/shm'
        base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None
        self.private = tempfile.mkdtemp(prefix='forkbox-kernel-', dir=base)
        # The kernel runs this bridge's interpreter (the sandbox's default
        # virtual environment's, so what `pip install` put there imports),
        # not the one of the system's kernel spec (Debian's names
        # /usr/bin/python3): a kernel spec of our own, found first.
        spec = os.path.join(self.private, 'kernels', 'forkbox')
        os.makedirs(spec)
        with open(os.path.join(spec, 'kernel.json'), 'w') as f:
            json.dump({'argv': [sys.executable, '-m', 'ipykernel_launcher', '-f', '{connection_file}'],
                       'display_name': 'Python 3', 'language': 'python'}, f)
        os.environ['JUPYTER_PATH'] = self.private
        env = dict(os.environ)
        env['JUPYTER_RUNTIME_DIR'] = self.private
        env.setdefault('MPLBACKEND', 'module://matplotlib_inline.backend_inline')
        self.km = KernelManager(kernel_name='forkbox', transport='ipc', ip=os.path.join(self.private, 'kernel'),
                                connection_file=os.path.join(self.private, 'kernel.json'))
        self.km.start_kernel(cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=sys.stderr)
        try:
            self.kc = self.km.client()
            self.kc.start_channels()
            # Shorter than the agent's wait, so that a kernel that does not
            # come up is shut down here (it leads a session of its own: the
            # agent's kill of the bridge's group would not reach it).
            self.kc.wait_for_ready(timeout=100)
            self.silent('CHARTS_SOURCE = %s\n' % json.dumps(charts) + SETUP + 'del CHARTS_SOURCE\n')
        except BaseException:
            self.close()
            raise
        self.seed = None
        with open(os.path.join(self.private, 'kernel.pid'), 'w') as f:
            f.write(str(self.kernel_pid()))

    def kernel_pid(self):
        p = getattr(self.km, 'provisioner', None)
        proc = getattr(p, 'process', None) if p is not None else None
        return getattr(proc, 'pid', 0) or 0

    def silent(self, code):
        """Runs code with no output and no history; returns the reply."""
        mid = self.kc.execute(code, silent=True, store_history=False, stop_on_error=False)
        while True:
            r = self.kc.get_shell_msg(timeout=120)
            if r['parent_header'].get('msg_id') == mid:
                return r

    def execute(self, req, interrupts):
        env_vars = req.get('env_vars') or {}
        # The session's environment, which the agent sends with every cell:
        # applied when it changed since the kernel started or the last cell
        # (a warm kernel started before its session's variables were set).
        seed = req.get('seed')
        # The variables go in as JSON text in a string literal, decoded by
        # the kernel (JSON pasted as Python source would turn a character
        # outside the BMP into two lone surrogates).
        if seed and seed != self.seed:
            self.silent('import os as _o, json as _j; _o.environ.update(_j.loads(%r)); del _o, _j' % json.dumps(seed))
        if seed is not None:
            self.seed = seed
        if env_vars:
            self.silent('import json as _j; __forkbox_env_saved = __forkbox_env_apply(_j.loads(%r)); del _j' % json.dumps(env_vars))
        try:
            self.run_cell(req.get('code', ''), lambda: interrupts.take(req.get('id')))
        finally:
            if env_vars and self.km.is_alive():
                self.silent('__forkbox_env_restore(__forkbox_env_saved); del __forkbox_env_saved')
        emit({'type': 'end_of_execution'})

    def run_cell(self, code, interrupted):
        # stop_on_error=False: with True, a kernel that just raised aborts
        # whatever request reaches it in the moment after (ipykernel's
        # abort window), and the next cell would come back empty. The
        # bridge sends one cell at a time, so there is no queue to drop.
        # A cell the kernel still aborts (it says so in its reply, having
        # run nothing) is sent again, a few times.
        asked = []

        def take():
            # An interrupt taken during an attempt that comes back aborted
            # still stops the cell: it is not sent again.
            if interrupted():
                asked.append(True)
                return True
            return False

        for _ in range(5):
            if self.run_once(code, take) != 'aborted' or asked:
                return
            time.sleep(0.05)
        emit({'type': 'error', 'name': 'KernelBusy',
              'value': 'The kernel aborted the cell five times without running it',
              'traceback': ''})

    def run_once(self, code, interrupted):
        """Sends one cell and relays its output; returns the status of its
        execute_reply ('ok', 'error', 'aborted') or None if none came."""
        mid = self.kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=False)
        errored = False
        replied = None
        quiet_since = None
        while True:
            if interrupted():
                self.km.interrupt_kernel()
            try:
                msg = self.kc.get_iopub_msg(timeout=0.1)
            except queue.Empty:
                if not replied:
                    replied = self.reply_ready(mid)
                if replied == 'aborted':
                    return replied
                if replied:
                    # The kernel answered; an idle status lost on the way
                    # (a full queue) must not hang the cell.
                    quiet_since = quiet_since or time.monotonic()
                    if time.monotonic() - quiet_since > 2:
                        return replied
                if not self.km.is_alive():
                    emit({'type': 'error', 'name': 'KernelDied',
                          'value': 'The kernel died while running the cell; the next call restarts it',
                          'traceback': ''})
                    emit({'type': 'end_of_execution'})
                    sys.exit(3)
                continue
            quiet_since = None
            if msg['parent_header'].get('msg_id') != mid:
                continue
            t = msg['msg_type']
            c = msg['content']
            if t == 'stream':
                name = 'stderr' if c.get('name') == 'stderr' else 'stdout'
                text = c.get('text', '')
                ts = stamp(msg)
                for i in range(0, len(text), CHUNK):
                    emit({'type': name, 'text': text[i:i + CHUNK], 'timestamp': ts})
            elif t == 'execute_input':
                emit({'type': 'number_of_executions', 'execution_count': c.get('execution_count')})
            elif t in ('display_data', 'update_display_data'):
                emit(result_line(c.get('data', {}), False))
            elif t == 'execute_result':
                emit(result_line(c.get('data', {}), True))
            elif t == 'error':
                if not errored:
                    errored = True
                    emit({'type': 'error', 'name': c.get('ename', ''), 'value': c.get('evalue', ''),
                          'traceback': '\n'.join(c.get('traceback', []))})
            elif t == 'status' and c.get('execution_state') == 'idle':
                # The cell is over; its execute_reply comes on the shell
                # channel, maybe a moment later: wait for it there (not
                # for iopub messages that will not come).
                if not replied:
                    replied = self.reply_ready(mid, timeout=2)
                return replied

    def reply_ready(self, mid, timeout=0):
        """Reads the cell's execute_reply if it arrived, waiting up to
        timeout seconds for it; returns its status ('ok', 'error',
        'aborted') or None if it did not come."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                r = self.kc.get_shell_msg(timeout=max(0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if r['parent_header'].get('msg_id') == mid:
                return r['content'].get('status') or 'ok'

    def close(self):
        try:
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=True)
        except Exception:
            pass
        shutil.rmtree(self.private, ignore_errors=True)


class Interrupts:
    """The cells (by the agent's id) the agent asked to interrupt."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ids = set()

    def add(self, cell):
        with self.lock:
            self.ids.add(cell)

    def take(self, cell):
        """Reports whether cell was asked to stop since the last call."""
        with self.lock:
            if cell in self.ids:
                self.ids.discard(cell)
                return True
            return False

    def forget(self, cell):
        with self.lock:
            self.ids = {i for i in self.ids if i > cell}


def main():
    cwd = sys.argv[1]
    charts = sys.argv[2]
    try:
        b = Bridge(cwd, charts)
    except Exception as e:  # the kernel did not start
        emit({'type': 'fatal', 'name': type(e).__name__, 'value': str(e)})
        return 2
    emit({'type': 'ready', 'kernel_pid': b.kernel_pid(), 'dir': b.private})
    cells = queue.Queue()
    interrupts = Interrupts()

    def read():
        for raw in sys.stdin:
            try:
                req = json.loads(raw)
            except ValueError:
                continue
            if req.get('op') == 'interrupt':
                interrupts.add(req.get('id'))
            elif req.get('op') == 'execute':
                cells.put(req)
        cells.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        while True:
            req = cells.get()
            if req is None:
                return 0
            b.execute(req, interrupts)
            interrupts.forget(req.get('id', 0))
    finally:
        b.close()


if __name__ == '__main__':
    sys.exit(main())
