"""The built wheel is well formed, pip installs it into a fresh venv, and the
installed package imports and loads its extension."""

import base64
import glob
import hashlib
import os
import subprocess
import sys
import sysconfig
import zipfile

import pytest

import verify_attn


def _wheel_path():
    if os.environ.get("VERIFY_ATTN_WHEEL"):
        return os.environ["VERIFY_ATTN_WHEEL"]
    srcdir = os.environ.get("TEST_SRCDIR")
    if not srcdir:
        pytest.skip("run under bazel test, or set VERIFY_ATTN_WHEEL")
    found = glob.glob(os.path.join(srcdir, "*", "python", "verify_attn-*.whl"))
    assert len(found) == 1, found
    return found[0]


def test_wheel_name_and_record():
    path = _wheel_path()
    tag = "cp%d%d" % sys.version_info[:2]
    name = os.path.basename(path)
    assert name == "verify_attn-%s-%s-%s-linux_x86_64.whl" % (verify_attn.__version__, tag, tag)
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        info = "verify_attn-%s.dist-info" % verify_attn.__version__
        assert {"verify_attn/__init__.py", "verify_attn/_C.so", info + "/METADATA",
                info + "/WHEEL", info + "/RECORD"} <= names
        wheel = zf.read(info + "/WHEEL").decode()
        assert "Root-Is-Purelib: false" in wheel
        assert "Tag: %s-%s-linux_x86_64" % (tag, tag) in wheel
        record = zf.read(info + "/RECORD").decode().strip().splitlines()
        listed = {line.split(",")[0] for line in record}
        assert listed == names
        for line in record:
            fname, digest, size = line.split(",")
            if fname.endswith("RECORD"):
                continue
            data = zf.read(fname)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == "sha256=" + want, fname
            assert int(size) == len(data), fname


def test_wheel_installs_into_fresh_venv(tmp_path):
    path = _wheel_path()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    # No PYTHONPATH for pip: an installed copy there would make pip skip the install.
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([py, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--disable-pip-version-check", path], check=True, env=clean)
    # torch is a declared dependency; borrow this interpreter's copy rather
    # than downloading it again (appended, so the venv's verify_attn wins).
    env = dict(os.environ)
    env["PYTHONPATH"] = sysconfig.get_paths()["purelib"]
    code = ("import verify_attn, os; print(verify_attn.__version__); "
            "print(os.path.dirname(verify_attn.__file__)); "
            "print(verify_attn.runtime_info()['compiled_archs'])")
    res = subprocess.run([py, "-c", code], capture_output=True, text=True,
                         env=env, cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    out = res.stdout.split("\n")
    assert out[0] == verify_attn.__version__
    assert out[1].startswith(str(venv)), out
    assert "sm_" in out[2]
