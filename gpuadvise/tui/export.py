"""Writing an export from either app: a relative path is taken from the export folder, the report and
its chart files are each written atomically, and the outcome is a notification, never an exception."""

from __future__ import annotations

from pathlib import Path

from gpuadvise.analyzer.errors import InputError

from .text import clean


def export_files(app, path: Path, files, written_title: str) -> Path | None:
    """`files(path)` → [(target, text)]; returns the path written, or None after saying why not."""
    from gpuadvise.analyzer.report.output import write_atomic

    if not path.is_absolute():
        path = app.export_dir / path
    try:
        if path.is_dir():
            raise InputError(path, "is a folder")
        if not path.parent.is_dir():
            raise InputError(path, f"folder {path.parent} does not exist")
        for target, text in files(path):
            write_atomic(target, text)
    except (InputError, OSError) as exc:
        message = str(exc) if isinstance(exc, InputError) else f"{path}: cannot write: {exc.strerror or exc}"
        app.notify(clean(message), title="Export failed", severity="error", timeout=8, markup=False)
        return None
    app.last_export = path
    app.notify(clean(str(path)), title=written_title, timeout=8, markup=False)
    return path
