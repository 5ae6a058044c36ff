"""The remote cache against a real redis-server (started here on a loopback
port, stopped after): two machines (two cache folders) sharing one Redis,
entries nobody can forge, a dead or paused server, eight warming processes,
and the secret file's rules. Drives the `kiln` tool installed with the
package; skips (and says why) where redis-server is not installed."""
import os
import pathlib
import shutil
import socket
import subprocess
import time

import pytest

from kiln._warm import binary

from measured import run_kiln

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
GRAPH = EXAMPLES / "pointwise" / "scale_shift_gelu.json"

if shutil.which("redis-server") is None:
    pytest.skip("skipped: redis-server is not installed (tools/dev.sh installs it)", allow_module_level=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    def __init__(self, folder):
        self.port = free_port()
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            if self.cli("PING").strip() == "PONG":
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def cli(self, *args, data=None):
        done = subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, input=data)
        return done.stdout.decode(errors="replace")

    def keys(self, kind):
        return [k for k in self.cli("--scan", "--pattern", f"kiln:v1:{kind}:*").split() if k]

    def stop(self):
        self.process.kill()
        self.process.wait()


@pytest.fixture
def redis(tmp_path):
    server = Redis(tmp_path)
    yield server
    server.stop()


def secret_file(folder, name="secret", text="0123456789abcdef-the-fleet-secret", mode=0o600):
    path = folder / name
    path.write_text(text)
    path.chmod(mode)
    return path


def owned_by_someone_else(path):
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    os.chown(path, 12345, -1)
    return path


def kiln(*args, env):
    full = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    full.update(env)
    return subprocess.run([binary(), *map(str, args)], capture_output=True, text=True, env=full, timeout=600)


def environment(redis, secret, **more):
    return dict(KILN_REMOTE_CACHE=redis.url, KILN_REMOTE_CACHE_SECRET_FILE=str(secret), **more)


def test_a_second_machine_compiles_nothing(redis, tmp_path):
    env = environment(redis, secret_file(tmp_path))
    first = kiln("warm", EXAMPLES / "pointwise", "--arch", "sm_90", "--cache-dir", tmp_path / "a", env=env)
    assert first.returncode == 0, first.stderr
    assert redis.keys("kernel") and redis.keys("recipe")
    second = kiln("warm", EXAMPLES / "pointwise", "--arch", "sm_90", "--cache-dir", tmp_path / "b",
                  env=dict(env, KILN_FAIL_IF_COMPILING="1"))
    assert second.returncode == 0, second.stderr
    assert "(0 compiled," in second.stdout
    compiled = kiln("compile", GRAPH, "--arch", "sm_90", "--cache-dir", tmp_path / "c", env=dict(env, KILN_FAIL_IF_COMPILING="1"))
    assert compiled.returncode == 0, compiled.stderr
    stats = kiln("cache", "stats", "--cache-dir", tmp_path / "b", env=env)
    assert "remote cache, all runs with this cache:" in stats.stdout and " 0 refused" in stats.stdout
    explained = kiln("cache", "explain", GRAPH, "--arch", "sm_90", "--cache-dir", tmp_path / "b", env=env)
    assert "remote: held" in explained.stdout


def refused_then_recompiled(tmp_path, env, label):
    """A compile in a fresh folder refuses the remote entries and compiles the
    kernel itself. Each refused value is warned about and counted once,
    though the compile looks for the kernel twice (through the remote's
    recipe, then to compile it)."""
    done = kiln("compile", GRAPH, "--arch", "sm_90", "--cache-dir", tmp_path / label, env=env)
    assert done.returncode == 0, done.stderr
    refused = [line.split("the value under ")[1].split()[0] for line in done.stderr.splitlines() if "is refused" in line]
    assert refused and len(refused) == len(set(refused)), done.stderr
    assert "compiled in" in done.stdout  # not a cache hit
    stats = kiln("cache", "stats", "--cache-dir", tmp_path / label, env=env)
    assert f" {len(refused)} refused," in stats.stdout, stats.stdout


def fill(redis, tmp_path, env):
    done = kiln("compile", GRAPH, "--arch", "sm_90", "--cache-dir", tmp_path / "filler", env=env)
    assert done.returncode == 0, done.stderr
    (key,) = redis.keys("kernel")
    return key


def test_an_entry_under_another_secret_is_refused(redis, tmp_path):
    fill(redis, tmp_path, environment(redis, secret_file(tmp_path, "mallory", "another-secret-of-16-bytes")))
    refused_then_recompiled(tmp_path, environment(redis, secret_file(tmp_path)), "victim")


@pytest.mark.parametrize("damage", ["tamper", "truncate", "swap"])
def test_damaged_or_forged_values_are_refused(redis, tmp_path, damage):
    env = environment(redis, secret_file(tmp_path))
    key = fill(redis, tmp_path, env)
    if damage == "tamper":  # one byte of the payload changed
        redis.cli("SETRANGE", key, "200", "X")
    elif damage == "truncate":
        value = subprocess.run(["redis-cli", "-p", str(redis.port), "--no-raw", "STRLEN", key], capture_output=True,
                               text=True).stdout.split()[-1]
        redis.cli("EVAL", f"redis.call('SET', KEYS[1], string.sub(redis.call('GET', KEYS[1]), 1, {int(value) // 2})) return 1",
                  "1", key)
    else:  # a valid value of another entry, stored under this key
        other = kiln("compile", EXAMPLES / "pointwise" / "diamond.json", "--arch", "sm_90", "--cache-dir",
                     tmp_path / "other", env=env)
        assert other.returncode == 0
        donor = next(k for k in redis.keys("kernel") if k != key)
        redis.cli("EVAL", "redis.call('SET', KEYS[1], redis.call('GET', KEYS[2])) return 1", "2", key, donor)
    refused_then_recompiled(tmp_path, env, "victim")


def test_values_larger_than_any_entry_are_refused_unread(redis, tmp_path):
    # 100 MiB under each of the graph's keys (its kernel and its recipe):
    # refused from the length Redis announces, so the compile neither
    # downloads nor hashes them and its memory stays near a compile's. (A
    # timeout of 3 s: redis-server takes a few hundred ms to begin sending
    # 100 MiB on a busy machine, and the first bytes must come in time.)
    env = environment(redis, secret_file(tmp_path), KILN_REMOTE_CACHE_TIMEOUT_MS="3000")
    fill(redis, tmp_path, env)
    planted = redis.keys("kernel") + redis.keys("recipe")
    for key in planted:
        redis.cli("EVAL", "redis.call('SET', KEYS[1], string.rep('x', ARGV[1])) return 1", "1", key, str(100 << 20))
    base = run_kiln(["compile", GRAPH, "--arch", "sm_90", "--cache-dir", tmp_path / "baseline"], {})
    done = run_kiln(["compile", GRAPH, "--arch", "sm_90", "--cache-dir", tmp_path / "victim"], env)
    assert done.returncode == 0, done.stderr
    assert "compiled in" in done.stdout
    assert done.stderr.count("more than the 16 MiB a kiln entry may be, so it was not read") == len(planted), done.stderr
    assert done.peak_bytes - base.peak_bytes < 64 << 20, (done.peak_bytes, base.peak_bytes)
    assert done.seconds - base.seconds < len(planted) * 3.0, (done.seconds, base.seconds)  # each within its deadline
    stats = kiln("cache", "stats", "--cache-dir", tmp_path / "victim", env=env)
    assert f" {len(planted)} refused, 0 errors" in stats.stdout, stats.stdout


def test_a_dead_server_costs_one_timeout_and_compiles_go_on(redis, tmp_path):
    env = environment(redis, secret_file(tmp_path), KILN_REMOTE_CACHE_TIMEOUT_MS="200", KILN_REMOTE_CACHE_BREAKER_MS="600000")
    redis.stop()
    start = time.monotonic()
    done = kiln("warm", EXAMPLES / "pointwise", "--arch", "sm_90", "--cache-dir", tmp_path / "a", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("not asked again") == 1, done.stderr
    assert time.monotonic() - start < 120


def test_a_server_killed_mid_warm(redis, tmp_path):
    # (a breaker longer than any warm here: a slow machine would otherwise ask again after 30 s)
    env = environment(redis, secret_file(tmp_path), KILN_REMOTE_CACHE_TIMEOUT_MS="200", KILN_REMOTE_CACHE_BREAKER_MS="600000")
    # The held-rows examples: 11 graphs, 17 distinct kernels, one at a time; the server dies after
    # the second is written, and the other 15 compile without it (every example, 196 kernels, took 50 s).
    warm = subprocess.Popen([binary(), "warm", str(EXAMPLES / "held_rows"), "--arch", "sm_80", "--jobs", "1",
                             "--cache-dir", str(tmp_path / "a")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**{k: v for k, v in os.environ.items() if not k.startswith("KILN_")}, **env})
    for _ in range(200):  # until the first kernels have been written through
        if len(redis.keys("kernel")) >= 2:
            break
        time.sleep(0.05)
    redis.stop()
    out, err = warm.communicate(timeout=600)
    assert warm.returncode == 0, err
    assert ", 0 failed)" in out and err.count("not asked again") == 1, err


def test_a_paused_server_is_bounded_by_the_timeout(redis, tmp_path):
    env = environment(redis, secret_file(tmp_path), KILN_REMOTE_CACHE_TIMEOUT_MS="300")
    fill(redis, tmp_path, env)
    redis.process.send_signal(19)  # SIGSTOP: the server hangs, connections stay open
    try:
        start = time.monotonic()
        done = kiln("compile", GRAPH, "--arch", "sm_90", "--cache-dir", tmp_path / "b", env=env)
        elapsed = time.monotonic() - start
    finally:
        redis.process.send_signal(18)  # SIGCONT
    assert done.returncode == 0, done.stderr
    assert "not asked again" in done.stderr
    assert elapsed < 30, elapsed


def test_eight_processes_warming_at_once(redis, tmp_path):
    env = environment(redis, secret_file(tmp_path))
    procs = [subprocess.Popen([binary(), "warm", str(EXAMPLES / "pointwise"), str(EXAMPLES / "norm"), "--arch", "sm_90",
                               "--jobs", "1", "--cache-dir", str(tmp_path / f"m{i}")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**{k: v for k, v in os.environ.items() if not k.startswith("KILN_")}, **env})
             for i in range(8)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        assert "refused" not in err
    # every entry valid: a fresh machine takes all of them and compiles nothing
    check = kiln("warm", EXAMPLES / "pointwise", EXAMPLES / "norm", "--arch", "sm_90", "--cache-dir", tmp_path / "fresh",
                 env=dict(env, KILN_FAIL_IF_COMPILING="1"))
    assert check.returncode == 0 and "(0 compiled," in check.stdout, check.stderr
    for i in range(8):
        verified = kiln("cache", "verify", "--cache-dir", tmp_path / f"m{i}", env=env)
        assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.parametrize("make, says", [
    (lambda d: secret_file(d, mode=0o644), "others may read it"),
    (lambda d: secret_file(d, mode=0o640), "others may read it"),
    (lambda d: secret_file(d, text="short"), "shorter than 16 bytes"),
    (lambda d: (d / "folder").mkdir() or d / "folder", "not a regular file"),
    (lambda d: (d / "link").symlink_to(secret_file(d)) or d / "link", "not a link"),
    (lambda d: d / "missing", "No such file"),
    (lambda d: owned_by_someone_else(secret_file(d)), "owned by uid 12345"),
])
def test_the_secret_file_must_be_the_users_alone(redis, tmp_path, make, says):
    env = environment(redis, make(tmp_path))
    done = kiln("compile", GRAPH, "--arch", "sm_90", "--cache-dir", tmp_path / "a", env=env)
    assert done.returncode == 0, done.stderr  # the compile goes on, locally
    assert says in done.stderr and "the remote cache is off" in done.stderr, done.stderr
    assert redis.keys("kernel") == []


def test_without_a_secret_the_remote_is_off_with_one_warning(redis, tmp_path):
    done = kiln("compile", GRAPH, "--arch", "sm_90", "--cache-dir", tmp_path / "a", env={"KILN_REMOTE_CACHE": redis.url})
    assert done.returncode == 0
    assert done.stderr.count("no secret") == 1
    assert redis.keys("kernel") == []


def test_the_remote_cache_option_and_a_bad_url(redis, tmp_path):
    secret = secret_file(tmp_path)
    done = kiln("compile", GRAPH, "--arch", "sm_90", "--cache-dir", tmp_path / "a", "--remote-cache", redis.url,
                env={"KILN_REMOTE_CACHE_SECRET_FILE": str(secret)})
    assert done.returncode == 0 and redis.keys("kernel"), done.stderr
    bad = kiln("compile", GRAPH, "--arch", "sm_90", "--cache-dir", tmp_path / "b", "--remote-cache", "http://x",
               env={"KILN_REMOTE_CACHE_SECRET_FILE": str(secret)})
    assert bad.returncode == 0 and "expected redis://" in bad.stderr
    tls = kiln("compile", GRAPH, "--arch", "sm_90", "--cache-dir", tmp_path / "c", "--remote-cache",
               f"rediss://127.0.0.1:{redis.port}", env={"KILN_REMOTE_CACHE_SECRET_FILE": str(secret)})
    assert tls.returncode == 0 and "TLS" in tls.stderr
