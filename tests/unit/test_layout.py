"""csrc/ has no include or call cycles and keeps its vector code under x86/, the Cython
modules have no cimport cycles, the Python modules no import cycles (scripts/check_layout.py),
and the check itself finds what it is meant to find."""
from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _checker():
    spec = importlib.util.spec_from_file_location("check_layout", REPO / "scripts" / "check_layout.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_csrc_has_no_cycles(capsys):
    assert _checker().main([]) == 0, capsys.readouterr().out


def test_the_run_loop_is_above_the_kernels():
    includes, calls = _checker().graphs(REPO / "csrc")
    assert "cpu/matmul/mul_mat.c" in calls["cpu/exec.c"]        # through the kernel table
    assert "cpu/job.c" in calls["cpu/ops/copy.c"]               # gr_fail
    for src, deps in calls.items():
        assert "cpu/exec.c" not in deps, src


def test_a_call_cycle_is_found(tmp_path, capsys):
    (tmp_path / "a.c").write_text('#include "a.h"\nint a_one(void) { return b_two(); }\n')
    (tmp_path / "a.h").write_text("int a_one(void);\n")
    (tmp_path / "b.c").write_text("static int helper(void) { return 1; }\n"
                                  "int b_two(void) { return helper() + a_one(); }\n")
    assert _checker().main(["--root", str(tmp_path)]) == 1
    assert "call cycle: a.c -> b.c -> a.c" in capsys.readouterr().out


def test_an_include_cycle_is_found(tmp_path, capsys):
    (tmp_path / "x.h").write_text('#include "y.h"\n')
    (tmp_path / "y.h").write_text('#include "x.h"\n')
    (tmp_path / "z.c").write_text('#include "x.h"\nint g_table[4] = {0};\n')
    assert _checker().main(["--root", str(tmp_path)]) == 1
    assert "include cycle: x.h -> y.h -> x.h" in capsys.readouterr().out


def test_static_names_and_prototypes_make_no_edges(tmp_path, capsys):
    (tmp_path / "a.c").write_text("static int shared(void) { return 1; }\nint b_two(void);\n"
                                  "int a_one(void) { return shared(); }\n")
    (tmp_path / "b.c").write_text("static int shared(void) { return 2; }\n"
                                  "int b_two(void) { return shared() + a_one(); }\n")
    assert _checker().main(["--root", str(tmp_path)]) == 0, capsys.readouterr().out


def test_the_native_modules_layer():
    g = _checker().cimports(REPO / "ggmlrpc" / "_native")
    assert g["hostmem"] == {"rpc", "sockio"}
    assert g["codec"] == {"rpc"} and g["sockio"] == {"rpc"} and g["rpc"] == set()


def test_a_cimport_cycle_is_found(tmp_path, capsys):
    (tmp_path / "a.pxd").write_text("from ggmlrpc._native.b cimport f\n")
    (tmp_path / "b.pyx").write_text("from ggmlrpc._native.a cimport g\n")
    (tmp_path / "c.c").write_text("int c_one(void) { return 1; }\n")
    assert _checker().main(["--root", str(tmp_path), "--native", str(tmp_path)]) == 1
    assert "cimport cycle: a -> b -> a" in capsys.readouterr().out


def test_vector_code_outside_x86_is_found(tmp_path, capsys):
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "x86").mkdir()
    (tmp_path / "ops" / "x86" / "fast.c").write_text("__m256 twice(__m256 v) { return _mm256_add_ps(v, v); }\n")
    (tmp_path / "ops" / "hint.c").write_text("void wait(void) { _mm_pause(); }  /* __m256 in a comment */\n")
    assert _checker().main(["--root", str(tmp_path)]) == 0, capsys.readouterr().out
    (tmp_path / "ops" / "slow.c").write_text("int lanes(void) { return (int)sizeof(__m512i); }\n")
    assert _checker().main(["--root", str(tmp_path)]) == 1
    assert "vector code outside an x86/ folder: ops/slow.c" in capsys.readouterr().out


def test_the_python_modules_layer():
    g = _checker().python_imports(REPO / "ggmlrpc")
    assert "session" in g["server"] and "server" not in g["session"]   # TYPE_CHECKING only
    assert "compute.cpu" in g["devices.cpu"]                            # a function-local import
    assert "cli.common" in g["cli.run"] and "cli.main" not in g["cli.run"]


def test_a_python_import_cycle_is_found(tmp_path, capsys):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import g\n    return g\n")
    (tmp_path / "c.c").write_text("int c_one(void) { return 1; }\n")
    args = ["--root", str(tmp_path), "--native", str(tmp_path), "--package", str(pkg)]
    assert _checker().main(args) == 0, capsys.readouterr().out   # b -> a only
    (pkg / "a.py").write_text("import pkg.sub.b\n")
    assert _checker().main(args) == 1
    assert "import cycle: a -> sub.b -> a" in capsys.readouterr().out
