"""The shared name registry (models, strategies, importers, parsers): duplicates, unknown names, lazy loading."""
from __future__ import annotations

import sys

import pytest

from dlscale import ConfigError
from dlscale.registry import Registry
from helpers_cli import names


def _package(tmp_path, monkeypatch, name: str, modules: dict[str, str]) -> None:
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from dlscale.registry import Registry\nREG = Registry('widget', __name__, skip=('helpers',))\n")
    for mod, body in modules.items():
        (pkg / f"{mod}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)


REG_LINE = "from {p} import REG\nREG.add({n!r}, {v})\n"  # an entry's module: registers one value


def test_loads_the_package_once_and_lists_sorted_names(tmp_path, monkeypatch):
    _package(tmp_path, monkeypatch, "widgets_a", {
        "zeta": REG_LINE.format(p="widgets_a", n="zeta", v=1),
        "alpha": REG_LINE.format(p="widgets_a", n="alpha", v=2),
        "helpers": "raise RuntimeError('skip names a module that is not an entry')\n",
        "_private": "raise RuntimeError('modules named _... are not entries')\n",
    })
    import widgets_a

    assert widgets_a.REG._entries == {}  # nothing imported until asked
    assert widgets_a.REG.names() == ["alpha", "zeta"] and widgets_a.REG.get("zeta") == 1
    assert widgets_a.REG.entries() == {"alpha": 2, "zeta": 1}
    widgets_a.REG.replace("alpha", 3)
    assert widgets_a.REG.get("alpha") == 3


def test_a_name_imports_its_own_module_only(tmp_path, monkeypatch):
    _package(tmp_path, monkeypatch, "widgets_b", {
        "one_two": REG_LINE.format(p="widgets_b", n="one-two", v=1),
        "other": REG_LINE.format(p="widgets_b", n="three", v=3),
        "helpers": "raise RuntimeError('skip names a module that is not an entry')\n",
    })
    import widgets_b

    assert widgets_b.REG.get("one-two") == 1  # one-two lives in one_two.py
    assert "widgets_b.other" not in sys.modules
    assert widgets_b.REG.get("three") == 3  # in a module of another name: every module is imported
    assert not widgets_b.REG.has("helpers") and not widgets_b.REG.has("four")
    with pytest.raises(ConfigError, match="four"):
        widgets_b.REG.get("four")


def test_unknown_and_twice_registered_names():
    reg: Registry[int] = Registry("gadget", "dlscale.models")
    reg._loaded = True  # no package modules for this one
    reg.add("alpha", 1)
    reg.add("gamma", 3)
    with pytest.raises(RuntimeError, match=names("gadget", "alpha")):  # the kind and the name
        reg.add("alpha", 2)
    assert reg.get("alpha") == 1  # the first entry stands
    # one line: the kind, the name asked for and every name there is
    with pytest.raises(ConfigError, match=names("gadget", "beta", "alpha", "gamma")):
        reg.get("beta")
    with pytest.raises(ConfigError, match=names("gadget", "beta")):
        reg.replace("beta", 2)
    assert not reg.has("beta")


def test_the_project_registries_skip_what_is_not_an_entry():
    from dlscale.importers import importer_names

    assert "cli" not in importer_names() and "records" not in importer_names() and "table" in importer_names()
