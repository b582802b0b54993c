"""The package's top-level functions: importing a submodule of the same name keeps them."""

from __future__ import annotations


def test_package_exports_the_functions() -> None:
    import drainer
    import drainer.producer  # importing the module must not shadow the function

    assert callable(drainer.enqueue) and callable(drainer.enqueue_many)
    assert callable(drainer.run_once) and callable(drainer.task)
