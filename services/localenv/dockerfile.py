"""Read a task's Dockerfile into the steps the local environment replays on the host.

``parse`` splits a Dockerfile into instructions (continuations, comments and
heredocs handled as Docker does); ``plan_build`` turns them into a ``BuildPlan``:
the base image reference, the steps that change files (RUN, COPY/ADD, WORKDIR) with
ARG/ENV already substituted, and the final image configuration (ENV, WORKDIR, USER).

What cannot be imitated raises ``UnsupportedEnvironmentError`` naming the line:
multi-stage builds (a second FROM, ``COPY --from``), ``FROM scratch``, ADD from a
URL, and RUN mounts other than caches. Instructions with no meaning outside Docker
(CMD, ENTRYPOINT, EXPOSE, LABEL, VOLUME, HEALTHCHECK, ...) are recorded as notes.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from services.localenv.errors import UnsupportedEnvironmentError

DEFAULT_SHELL = ("/bin/sh", "-c")
_IGNORED = {
    "CMD",
    "ENTRYPOINT",
    "EXPOSE",
    "LABEL",
    "MAINTAINER",
    "VOLUME",
    "STOPSIGNAL",
    "HEALTHCHECK",
    "ONBUILD",
}
_KNOWN = {*_IGNORED, "FROM", "ARG", "ENV", "WORKDIR", "COPY", "ADD", "RUN", "USER", "SHELL"}
_HEREDOC_RE = re.compile(r"<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_Unsupported = Callable[["Instruction", str], UnsupportedEnvironmentError]


@dataclass(frozen=True, slots=True)
class Heredoc:
    """The body of one ``<<NAME`` here-document that follows an instruction."""

    name: str
    body: str


@dataclass(frozen=True, slots=True)
class Instruction:
    """One Dockerfile instruction: keyword (upper case), its text, and its first line."""

    keyword: str
    value: str
    line: int
    heredocs: tuple[Heredoc, ...] = ()
    source: str = ""
    """The instruction as written (continuations joined, heredoc bodies included)."""


@dataclass(frozen=True, slots=True)
class RunStep:
    """Run ``argv`` (shell plus script, or the exec form) in the image being built."""

    line: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    workdir: str
    user: str | None
    text: str


@dataclass(frozen=True, slots=True)
class CopyStep:
    """Copy files from the build context (or a heredoc) into the image."""

    line: int
    sources: tuple[str, ...]
    dest: str
    dest_is_dir: bool
    add: bool
    chown: str | None
    chmod: str | None
    content: str | None
    text: str


@dataclass(frozen=True, slots=True)
class WorkdirStep:
    """Create the working folder (Docker creates every WORKDIR)."""

    line: int
    path: str
    user: str | None


Step = RunStep | CopyStep | WorkdirStep


@dataclass(slots=True)
class BuildPlan:
    """Everything the local environment needs from one Dockerfile."""

    base: str
    base_line: int
    steps: list[Step] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    user: str | None = None
    notes: list[str] = field(default_factory=list)


# -- reading --------------------------------------------------------------------------
def parse(text: str) -> list[Instruction]:
    """Split a Dockerfile into instructions (Docker's rules for lines and heredocs)."""
    lines = text.replace("\r\n", "\n").split("\n")
    out: list[Instruction] = []
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if not stripped or stripped.startswith("#"):
            i += 1
            continue
        start = i
        parts: list[str] = []
        while True:
            piece = lines[i].strip()
            i += 1
            if piece.endswith("\\"):
                parts.append(piece[:-1].rstrip())
                # Comment and empty lines inside a continuation are dropped.
                while i < len(lines) and (not lines[i].strip() or lines[i].strip().startswith("#")):
                    i += 1
                if i < len(lines):
                    continue
                break
            parts.append(piece)
            break
        logical = " ".join(p for p in parts if p)
        keyword, _, value = logical.partition(" ")
        keyword = keyword.upper()
        value = value.strip()
        heredocs: list[Heredoc] = []
        raw = [logical]
        if keyword in ("RUN", "COPY", "ADD"):
            for match in _HEREDOC_RE.finditer(value):
                strip_tabs, name = match.group(1) == "-", match.group(3)
                body: list[str] = []
                while i < len(lines) and lines[i].rstrip("\n") != name:
                    line = lines[i]
                    body.append(line.lstrip("\t") if strip_tabs else line)
                    i += 1
                raw += [*body, name]
                i += 1  # the terminator
                heredocs.append(Heredoc(name, "".join(f"{b}\n" for b in body)))
        out.append(Instruction(keyword, value, start + 1, tuple(heredocs), "\n".join(raw)))
    return out


def workdir_from_dockerfile(text: str) -> str | None:
    """Last ``WORKDIR`` of a Dockerfile (relative ones join the previous)."""
    workdir: str | None = None
    for ins in parse(text):
        if ins.keyword == "WORKDIR" and ins.value:
            words = split_words(ins.value, {})
            if words:
                workdir = _join(workdir or "/", words[0])
    return workdir


# -- words and substitution ------------------------------------------------------------
def split_words(text: str, env: Mapping[str, str]) -> list[str]:
    """Split ``text`` into words as Docker does: quotes, backslashes and ``$VAR`` expansion.

    Supports ``$NAME``, ``${NAME}``, ``${NAME:-default}`` and ``${NAME:+alternative}``;
    single quotes prevent expansion.
    """
    words: list[str] = []
    cur: list[str] = []
    in_word = quoted = False

    def end_word() -> None:
        # As in a shell, an unquoted word that expands to nothing disappears.
        if quoted or "".join(cur):
            words.append("".join(cur))

    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            if in_word:
                end_word()
                cur, in_word, quoted = [], False, False
            i += 1
            continue
        in_word = True
        if c == "\\" and i + 1 < n:
            cur.append(text[i + 1])
            i += 2
        elif c == "'":
            quoted = True
            end = text.find("'", i + 1)
            end = n if end < 0 else end
            cur.append(text[i + 1 : end])
            i = end + 1
        elif c == '"':
            quoted = True
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\" and i + 1 < n and text[i + 1] in '"\\$':
                    cur.append(text[i + 1])
                    i += 2
                elif text[i] == "$":
                    value, i = _expand_at(text, i, env)
                    cur.append(value)
                else:
                    cur.append(text[i])
                    i += 1
            i += 1
        elif c == "$":
            value, i = _expand_at(text, i, env)
            cur.append(value)
        else:
            cur.append(c)
            i += 1
    if in_word:
        end_word()
    return words


def _expand_at(text: str, i: int, env: Mapping[str, str]) -> tuple[str, int]:
    """Expand the variable reference starting at ``text[i] == '$'``."""
    if i + 1 < len(text) and text[i + 1] == "{":
        end = text.find("}", i + 2)
        if end < 0:
            return text[i:], len(text)
        inner = text[i + 2 : end]
        for op in (":-", ":+", "-", "+"):
            name, sep, word = inner.partition(op)
            if sep and _NAME_RE.fullmatch(name):
                word = " ".join(split_words(word, env))
                value = env.get(name)
                if op in (":-", "-"):
                    use_default = value is None or (op == ":-" and value == "")
                    return (word if use_default else str(value)), end + 1
                has_value = value is not None and (op == "+" or value != "")
                return (word if has_value else ""), end + 1
        return env.get(inner, ""), end + 1
    match = _NAME_RE.match(text, i + 1)
    if match is None:
        return "$", i + 1
    return env.get(match.group(0), ""), match.end()


def _json_list(value: str) -> list[str] | None:
    """The exec/JSON form of an instruction, or None for the shell form."""
    if not value.startswith("["):
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    if isinstance(parsed, list) and all(isinstance(x, str) for x in parsed):
        return [str(x) for x in parsed]
    return None


def _flags(value: str) -> tuple[dict[str, list[str]], str]:
    """Leading ``--name=value`` flags of an instruction, and the rest of its text."""
    flags: dict[str, list[str]] = {}
    rest = value
    while rest.startswith("--"):
        token, _, after = rest.partition(" ")
        name, _, flag_value = token[2:].partition("=")
        flags.setdefault(name.lower(), []).append(flag_value)
        rest = after.lstrip()
    return flags, rest


def _join(base: str, path: str) -> str:
    joined = path if path.startswith("/") else f"{base.rstrip('/')}/{path}"
    # As Docker does: '/a/b/../c' is '/a/c' (the sandbox refuses paths with '..').
    return "/" + posixpath.normpath(joined).lstrip("/")


# -- planning -------------------------------------------------------------------------
@dataclass(slots=True)
class _State:
    env: dict[str, str] = field(default_factory=dict)
    args: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    workdir_set: bool = False
    user: str | None = None
    shell: tuple[str, ...] = DEFAULT_SHELL

    @property
    def scope(self) -> dict[str, str]:
        """Variables visible to substitution and RUN: ENV overrides ARG (Docker's rule)."""
        return {**self.args, **self.env}


def plan_build(
    text: str, *, build_args: Mapping[str, str] | None = None, where: str = "Dockerfile"
) -> BuildPlan:
    """Turn a Dockerfile into a ``BuildPlan`` (raises UnsupportedEnvironmentError)."""
    build_args = dict(build_args or {})
    instructions = parse(text)
    global_args: dict[str, str] = {}
    plan: BuildPlan | None = None
    st = _State()

    def unsupported(ins: Instruction, why: str) -> UnsupportedEnvironmentError:
        return UnsupportedEnvironmentError(
            f"{where}:{ins.line}: {why} cannot be imitated by the local environment "
            f"({ins.keyword} {ins.value[:80]}); run this task with a Docker environment"
        )

    for ins in instructions:
        kw = ins.keyword
        if plan is None and kw not in ("FROM", "ARG"):
            raise UnsupportedEnvironmentError(
                f"{where}:{ins.line}: {kw} before FROM; a Dockerfile must start with FROM"
            )
        if kw == "FROM":
            if plan is not None:
                raise unsupported(ins, "a multi-stage build (a second FROM)")
            _, rest = _flags(ins.value)
            words = split_words(rest, global_args)
            if not words:
                raise UnsupportedEnvironmentError(f"{where}:{ins.line}: FROM without an image")
            if words[0] == "scratch":
                raise unsupported(ins, "FROM scratch (an empty image)")
            plan = BuildPlan(base=words[0], base_line=ins.line)
        elif kw == "ARG":
            for word in split_words(ins.value, st.scope if plan else global_args):
                name, has_default, default = word.partition("=")
                if plan is None:
                    value = build_args.get(name, default if has_default else None)
                    if value is not None:
                        global_args[name] = value
                    continue
                if name in build_args:
                    st.args[name] = build_args[name]
                elif has_default:
                    st.args[name] = default
                elif name in global_args:
                    st.args[name] = global_args[name]
        elif plan is None:
            continue
        elif kw == "ENV":
            _apply_env(ins, st)
        elif kw == "WORKDIR":
            words = split_words(ins.value, st.scope)
            if words:
                st.workdir = _join(st.workdir, words[0])
                st.workdir_set = True
                plan.steps.append(WorkdirStep(ins.line, st.workdir, st.user))
        elif kw == "USER":
            words = split_words(ins.value, st.scope)
            st.user = words[0] if words else None
        elif kw == "SHELL":
            shell = _json_list(ins.value)
            if not shell:
                raise UnsupportedEnvironmentError(
                    f'{where}:{ins.line}: SHELL must be a JSON array, e.g. ["/bin/bash", "-c"]'
                )
            st.shell = tuple(shell)
        elif kw == "RUN":
            plan.steps.append(_run_step(ins, st, plan, unsupported))
        elif kw in ("COPY", "ADD"):
            plan.steps.append(_copy_step(ins, st, unsupported))
        elif kw in _IGNORED:
            plan.notes.append(f"line {ins.line}: {kw} has no effect in the local environment")
        else:
            plan.notes.append(f"line {ins.line}: unknown instruction {kw} ignored")
    if plan is None:
        raise UnsupportedEnvironmentError(f"{where}: no FROM instruction")
    plan.env = dict(st.env)
    plan.workdir = st.workdir if st.workdir_set else None
    plan.user = st.user
    return plan


def _apply_env(ins: Instruction, st: _State) -> None:
    scope = st.scope
    words = split_words(ins.value, scope)
    if words and "=" not in words[0]:
        # Legacy form: ENV NAME the rest of the line.
        name, _, rest = ins.value.partition(" ")
        st.env[name] = " ".join(split_words(rest, scope))
        return
    for word in words:
        name, _, value = word.partition("=")
        st.env[name] = value


def _run_step(ins: Instruction, st: _State, plan: BuildPlan, unsupported: _Unsupported) -> RunStep:
    flags, rest = _flags(ins.value)
    for mount in flags.get("mount", []):
        kind = dict(p.partition("=")[::2] for p in mount.split(",")).get("type", "bind")
        if kind != "cache":
            raise unsupported(ins, f"RUN --mount=type={kind}")
        plan.notes.append(f"line {ins.line}: RUN --mount=type=cache runs without a cache")
    if "network" in flags:
        plan.notes.append(f"line {ins.line}: RUN --network ignored (builds have network)")
    exec_form = _json_list(rest)
    if ins.heredocs and rest.strip() == f"<<{ins.heredocs[0].name}":
        script = ins.heredocs[0].body  # RUN <<EOF ... EOF: the body is the script
    elif ins.heredocs:
        # RUN cmd <<EOF ... EOF: a shell script with its here-documents.
        script = f"{rest}\n" + "".join(f"{h.body}{h.name}\n" for h in ins.heredocs)
    else:
        script = rest
    if exec_form is not None and not ins.heredocs:
        argv: tuple[str, ...] = tuple(exec_form)
    elif ins.heredocs and script.startswith("#!"):
        argv = (*st.shell[:1], "-c", script)
    else:
        argv = (*st.shell, script)
    return RunStep(ins.line, argv, st.scope, st.workdir, st.user, f"RUN {ins.value}")


def _copy_step(ins: Instruction, st: _State, unsupported: _Unsupported) -> CopyStep:
    flags, rest = _flags(ins.value)
    if "from" in flags:
        raise unsupported(ins, "a multi-stage build (COPY --from)")
    for name in ("exclude", "parents"):
        if name in flags:
            raise unsupported(ins, f"{ins.keyword} --{name}")
    scope = st.scope
    listed = _json_list(rest)
    words = (
        [" ".join(split_words(w, scope)) for w in listed] if listed else split_words(rest, scope)
    )
    if len(words) < 2:
        raise UnsupportedEnvironmentError(
            f"Dockerfile:{ins.line}: {ins.keyword} needs a source and a destination"
        )
    *sources, dest = words
    content: str | None = None
    if ins.heredocs and sources == [f"<<{ins.heredocs[0].name}"]:
        content = ins.heredocs[0].body
    for src in sources:
        if re.match(r"^(https?|git)://|^git@", src):
            raise unsupported(ins, f"{ins.keyword} from a URL ({src})")
    dest_is_dir = (
        dest.endswith("/") or len(sources) > 1 or any(c in "".join(sources) for c in "*?[")
    )
    return CopyStep(
        line=ins.line,
        sources=tuple(sources),
        dest=_join(st.workdir, dest),
        dest_is_dir=dest_is_dir and content is None,
        add=ins.keyword == "ADD",
        chown=_last(flags, "chown"),
        chmod=_last(flags, "chmod"),
        content=content,
        text=f"{ins.keyword} {ins.value}",
    )


def _last(flags: Mapping[str, list[str]], name: str) -> str | None:
    values = flags.get(name)
    return values[-1] if values else None
