"""Which frame of a stack is the user's: the one judge every file:line a finding shows goes through.

A pointer into torch, a framework or the standard library sends the user to code they cannot change.
So every stack (the profile harness's live frames, a trace's `with_stack` Python frames and legacy
`Call stack` strings, dynamo's frame and graph-break records, a memory snapshot's allocation frames,
run.json's recorded sites) is read through `pick`: the first frame, innermost first, that is not
library code, and the library frame right inside it (what the user's line called), named beside it
where that helps ("train.py:40 (calls `train` in transformers)", never as a path to open).

A frame is library code when its file
- carries a marker that places it there on any machine: a `site-packages` / `dist-packages` /
  `lib/pythonX.Y` folder, `<frozen …>` / `<built-in …>` pseudo-files;
- exists on this machine and lies under an install root of the Python running this code: a
  site-packages / dist-packages folder, the standard library (both from `sysconfig` and `site`), the
  folder of an imported framework (a source build of torch), or gpuadvise's own package folders as this
  install maps them (`own_roots`: the import system's answer, so a checkout's `gpuadvise/`, `analyzer/`,
  `rules/` and `fixtures/` under an editable install, never the checkout around them: its tests and
  examples are user code whatever the checkout is called); a user's own folder that happens to be
  called `torch` is still theirs;
- does not exist here (a trace recorded elsewhere) and runs through a framework's source checkout
  (`…/transformers/…`, CHECKOUT_PACKAGES), or through gpuadvise's own package (`…/gpuadvise/harness/…`:
  a folder called `gpuadvise` followed by one of the names gpuadvise's package holds here, `own_layout`);
- is a relative path as the profiler writes installed files (it strips their sys.path entry:
  "torch/nn/modules/module.py", "threading.py") starting with a well-known library package
  (LIBRARY_PACKAGES) or a standard-library module, or laid out as gpuadvise's own package
  ("gpuadvise/harness/…", as above);
- or matches an entry of the environment variable GPUADVISE_LIBRARY_PATHS (os.pathsep-separated): an
  absolute folder (a prefix of the real path) or folder/package names matched as whole path components
  ("third_party", "vendor/apex"), for users who vendor libraries into their own tree.

Pure Python without torch: the harness (inside the user's process) and the analysis both import it.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache

ENV = "GPUADVISE_LIBRARY_PATHS"

# Top-level packages whose frames are never the user's, wherever the trace was recorded (the profiler
# writes installed packages' files relative to their sys.path entry). Frameworks that call the user's
# code (Trainer, Lightning, Accelerate, DeepSpeed) are here: the user's line is the one that called them.
# Names a user's own folder is often called ("datasets", "lightning") are not: a relative path cannot
# tell the two apart.
LIBRARY_PACKAGES = frozenset({
    "torch", "torchvision", "torchaudio", "torchtext", "torchdata", "torchrec", "torchao", "functorch",
    "triton", "numpy", "pandas", "scipy", "transformers", "accelerate", "tokenizers", "peft",
    "trl", "diffusers", "timm", "pytorch_lightning", "lightning_fabric", "deepspeed",
    "fairscale", "megatron", "apex", "xformers", "flash_attn", "bitsandbytes", "transformer_engine",
    "vllm", "flashinfer", "sglang", "einops", "tqdm", "safetensors", "huggingface_hub", "wandb",
    "tensorboard", "pyinstrument", "msgspec",
})
# gpuadvise's own import packages: one folder in a wheel (site-packages/gpuadvise), the folders
# pyproject.toml's `package-dir` maps them to in a checkout (gpuadvise/, analyzer/, rules/, fixtures/)
OWN_PACKAGES = ("gpuadvise", "gpuadvise.analyzer", "gpuadvise.rules", "gpuadvise.fixtures")
# Source checkouts of frameworks (an absolute path through one of these folders is theirs, not the user's);
# names a user's own folder often has ("datasets", "lightning") are left to the relative-path rule.
CHECKOUT_PACKAGES = frozenset({"torch", "torchvision", "transformers", "vllm", "sglang", "triton", "deepspeed",
                               "megatron", "pytorch_lightning", "lightning_fabric", "flashinfer",
                               "transformer_engine", "xformers", "flash_attn", "apex"})
# Standard-library module names a user's own script is often called: a relative "test.py" is theirs.
_USER_LIKE = frozenset({"test", "tests", "code", "profile", "trace", "token", "this", "types", "site", "main"})
_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) - _USER_LIKE
_MARKER = re.compile(r"(^|/)(site-packages|dist-packages)/|(^|/)lib(64)?/python\d(\.\d+)?/")
_LOCATION = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\):\s*(?P<func>.*)$")  # Kineto: "file(line): func"
_COLON = re.compile(r"^(?P<file>.+?):(?P<line>\d+)(?:\s+\((?P<func>[^)]*)\))?$")  # run.json: "file:line"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_TRACEBACK = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>\S+))?')


@dataclass(frozen=True)
class Frame:
    file: str
    line: int | None = None
    function: str = ""
    text: str = field(default="", compare=False)  # as the stack wrote it ("train.py(42): step"), when read from text

    @property
    def site(self) -> str:
        """file:line as the user knows the file (relative to the working folder when inside it)."""
        path = short_path(self.file)
        return f"{path}:{self.line}" if self.line is not None else path


@dataclass(frozen=True)
class Pick:
    """The user's frame of one stack, and the library frame it called (None where there is none)."""
    user: Frame | None
    library: Frame | None = None

    @property
    def site(self) -> str:
        """The user's file:line, "" when the stack holds no user frame."""
        return self.user.site if self.user is not None else ""

    def described(self) -> str:
        """The user's line with the library call beside it, named without a path the user would open:
        "train.py:40 (calls `train` in transformers)"."""
        if self.library is None:
            return self.site
        return f"{self.site} (calls {self.library_call})" if self.user is not None else f"no frame in your code (inside {self.library_call})"

    @property
    def library_call(self) -> str:
        """The library frame as "`function` in package" ("" without one)."""
        if self.library is None:
            return ""
        return f"`{self.library.function}` in {package(self.library.file)}" if self.library.function else package(self.library.file)


def library_label(frame: Frame) -> str:
    """A library frame's package-relative file and line ("torch/_dynamo/external_utils.py:67"), for the
    record (run.json), never for a finding's pointer."""
    path = frame.file.replace("\\", "/")
    m = re.search(r"(?:site-packages|dist-packages)/(.+)$", path) or re.search(r"lib(?:64)?/python\d(?:\.\d+)?/(.+)$", path)
    rel = m.group(1) if m else _own_label(path) or re.sub(r"^.*?/(?=torch/)", "", path)
    return f"{rel}:{frame.line}" if frame.line is not None else rel


def _own_label(path: str) -> str | None:
    """A file of gpuadvise's own code by its import path ("gpuadvise/analyzer/model/frames.py"), from where
    this install maps the package or from its layout; None for any other file."""
    if os.path.isabs(path) and os.path.exists(path):
        real = os.path.realpath(path)
        for name in OWN_PACKAGES:
            for root in _package_folders(name):
                if real.startswith(root + os.sep):
                    return name.replace(".", "/") + "/" + os.path.relpath(real, root).replace(os.sep, "/")
        return None
    parts = path.split("/")
    i = _own_start(parts)
    return "/".join(parts[i:]) if i is not None else None


def package(path: str) -> str:
    """The library a file belongs to, by name ("torch", "transformers", "threading")."""
    first = library_label(Frame(path)).lstrip("./").split("/", 1)[0]
    return first.removesuffix(".py") or "a library"


def parse(text: str) -> Frame | None:
    """One frame from its text: Kineto's "file(line): func", run.json's "file:line", a traceback's
    'File "file", line N, in func'. None for an empty or unreadable one."""
    text = (text or "").strip()
    if not text or text == "nan" or _CONTROL.search(text):  # no real file name holds terminal escapes
        return None
    for pattern in (_LOCATION, _TRACEBACK, _COLON):
        m = pattern.search(text) if pattern is _TRACEBACK else pattern.match(text)
        if m:
            return Frame(m.group("file").strip(), int(m.group("line")), (m.group("func") or "").strip(), text)
    return Frame(text, text=text) if text.endswith(".py") else None  # "nn.Module: Linear_0", "<built-in …>": not a frame


def is_library(path: str, stripped: bool = True) -> bool:
    """Whether a frame in this file is library code (the module docstring says how that is judged).
    `stripped=False` for a path made relative to the working folder (run.json's sites): only its
    markers count, a relative "datasets/x.py" there is the user's folder."""
    if not path:
        return True
    return _judge(path, os.environ.get(ENV, ""), stripped)


@lru_cache(maxsize=4096)
def _judge(path: str, configured: str, stripped: bool = True) -> bool:
    if path.startswith("<"):
        return not path.startswith("<ipython-input")  # a notebook cell is the user's code
    norm = path.replace("\\", "/")
    if _MARKER.search(norm) or _configured(norm, configured):
        return True
    if os.path.isabs(path) or re.match(r"^[A-Za-z]:/", norm):
        if os.path.exists(path):  # a file on this machine: where it really lies decides, not its folder names
            return _under(os.path.realpath(path), install_roots() + own_roots() + imported_roots())
        # another machine's: a framework's checkout, or gpuadvise's own package laid out as it is here
        return bool(CHECKOUT_PACKAGES.intersection(norm.split("/")[:-1])) or own_layout(norm)
    first = norm.lstrip("./").split("/", 1)[0].removesuffix(".py")
    return stripped and (first in LIBRARY_PACKAGES or first in _STDLIB or own_layout(norm))


def _under(real: str, roots) -> bool:
    return any(real == root or real.startswith(root + os.sep) for root in roots)


def _configured(norm: str, configured: str) -> bool:
    for entry in filter(None, (e.strip() for e in configured.split(os.pathsep))):
        entry = entry.replace("\\", "/").rstrip("/")
        if os.path.isabs(entry):
            if norm == entry or norm.startswith(entry + "/") or os.path.realpath(norm).startswith(os.path.realpath(entry) + os.sep):
                return True
        elif f"/{entry}/" in f"/{norm.lstrip('./')}":
            return True
    return False


@lru_cache(maxsize=1)
def install_roots() -> tuple[str, ...]:
    """Real paths of this Python's library folders: site-packages and the standard library."""
    import site
    import sysconfig

    roots: set[str] = set()
    paths = sysconfig.get_paths()
    roots.update(paths.get(k) or "" for k in ("stdlib", "platstdlib", "purelib", "platlib"))
    try:
        roots.update(site.getsitepackages())
    except AttributeError:  # an old virtualenv's site module
        pass
    roots.add(getattr(site, "USER_SITE", None) or "")
    return tuple(sorted({os.path.realpath(r) for r in roots if r}))


@lru_cache(maxsize=1)
def own_roots() -> tuple[str, ...]:
    """Real paths of the folders gpuadvise's own code lies in, as this install maps its packages (the
    import system's own answer for OWN_PACKAGES): site-packages/gpuadvise from a wheel; from a checkout
    under an editable install its gpuadvise/, analyzer/, rules/ and fixtures/ folders, never the checkout
    itself, whatever it is called."""
    return tuple(sorted({root for name in OWN_PACKAGES for root in _package_folders(name)}))


@lru_cache(maxsize=8)
def _package_folders(name: str) -> tuple[str, ...]:
    """The real folders the import system finds package `name` in (none where it is not importable)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return ()
    return tuple(os.path.realpath(p) for p in (spec.submodule_search_locations or []) if p) if spec is not None else ()


@lru_cache(maxsize=1)
def own_entries() -> frozenset[str]:
    """The names gpuadvise's top-level package holds here (its subpackages and modules: "harness",
    "cli.py", …), and the subpackages a checkout maps beside it ("analyzer", "rules", "fixtures"): a
    folder called `gpuadvise` followed by one of them is gpuadvise's own code on any machine."""
    names = {name.rsplit(".", 1)[1] for name in OWN_PACKAGES if "." in name}
    for root in _package_folders(OWN_PACKAGES[0]):
        try:
            entries = os.listdir(root)
        except OSError:
            continue
        names.update(e for e in entries if e.endswith(".py") or os.path.isfile(os.path.join(root, e, "__init__.py")))
    names.discard("__init__.py")
    return frozenset(names)


def own_layout(norm: str) -> bool:
    """A path (forward slashes) that runs through gpuadvise's own package: a folder called `gpuadvise`
    followed by a name that package holds ("…/gpuadvise/harness/facts/general.py"). A checkout called
    `gpuadvise` is not: its "tests", "examples" are no names of the package."""
    return _own_start(norm.split("/")) is not None


def _own_start(parts: list[str]) -> int | None:
    """Where gpuadvise's own package starts in a path's parts (the `gpuadvise` folder), None if nowhere."""
    entries = own_entries()
    return next((i for i in range(len(parts) - 1) if parts[i] == "gpuadvise" and parts[i + 1] in entries), None)


def imported_roots() -> tuple[str, ...]:
    """The folders of the frameworks this process has imported (a source build of torch lives outside
    site-packages)."""
    out = []
    for name in CHECKOUT_PACKAGES:
        module = sys.modules.get(name)
        where = getattr(module, "__file__", None)
        if where:
            out.append(os.path.realpath(os.path.dirname(where)))
    return tuple(out)


def pick(frames, innermost_first: bool = True) -> Pick:
    """The first user frame of a stack (innermost first unless told otherwise) and the library frame
    right inside it. `frames`: Frame objects, or texts `parse` reads."""
    seq = [f if isinstance(f, Frame) else parse(str(f)) for f in frames]
    seq = [f for f in seq if f is not None]
    if not innermost_first:
        seq.reverse()
    inner: Frame | None = None
    for f in seq:
        if not is_library(f.file):
            return Pick(f, inner)
        inner = f
    return Pick(None, seq[0] if seq else None)


def from_stack_string(stack: str) -> Pick:
    """A legacy `Call stack` string ("file(line): func;…", innermost first)."""
    if not stack or stack == "nan":
        return Pick(None)
    return pick(stack.split(";"))


def live(skip: int = 0) -> Pick:
    """The user's frame of the running Python stack, from the caller (`skip` frames further out) outwards."""
    f = sys._getframe(skip + 1)
    frames = []
    while f is not None and len(frames) < 200:
        frames.append(Frame(f.f_code.co_filename, f.f_lineno, f.f_code.co_name))
        f = f.f_back
    return pick(frames)


def user_site(text: str | None) -> str | None:
    """A site run.json recorded ("file:line", relative to the working folder when inside it) when it is
    the user's code; None for a library frame or nothing."""
    frame = parse(text or "")
    if frame is None or is_library(frame.file, stripped=False):
        return None
    return str(text).strip()


def short_path(path: str) -> str:
    """A source path as the user knows it: relative to the working folder when inside it."""
    if not os.path.isabs(path):
        return path
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return path
    return path if rel.startswith("..") else rel
