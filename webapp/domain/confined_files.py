"""File operations confined to a project's allowed roots, at every path component.

Paths that come from training jobs (a checkpoint's location, the files it lists) are
walked from an open file descriptor of the root: each component is opened relative to
its parent's descriptor with O_NOFOLLOW (O_DIRECTORY for directories, O_CLOEXEC), the way
CPython's shutil.rmtree walks a tree someone else controls. The kernel never follows a
symlink on our behalf, so there is no window between a check and the use: what is
opened is what was checked, and a symlink swapped in at any level is met, not followed.

Symlink policy:

- Reads, stats and the directories a path goes through: a symlink whose target stays
  inside the project's allowed roots is followed, by resolving it here (readlinkat, then
  walking the target again from the root's descriptor; relative targets are applied to
  the directories already walked, `..` included, which are real directories). At most
  MAX_LINKS links per path. A symlink whose target leaves the roots is Refused, at any
  level. (HF caches and shared tokenizers link inside the root; that keeps working.)
- Writes never follow a symlink at the last component: creating or replacing a file or
  a directory where a symlink stands is Refused.
- Deletes (`unlink`, `remove_tree`) remove the entry they name, never what a symlink
  points to; below the entry, `remove_tree` follows nothing (shutil.rmtree with dir_fd).

A root itself is the deployment's or project admin's configuration and is opened by its
path (a symlink in the root's own path is theirs to make). Relative paths from jobs must
not be absolute, contain '..', NUL bytes or empty components; they are Refused with a
message that says which rule they broke. Refused is raised before anything is written.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

MAX_LINKS = 40  # like the kernel's own limit on symlinks in one lookup
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
T = TypeVar("T")


class Refused(Exception):
    """The path is outside the allowed roots or breaks a path rule; nothing was done.
    `kind`: "rule" (absolute, '..', NUL, empty component), "outside" (not under a root),
    "symlink" (a symlink that leaves the roots, or too many), "type" (not a regular
    file where one was expected, or a symlink where one is written)."""

    def __init__(self, message: str, kind: str = "rule"):
        super().__init__(message)
        self.kind = kind


def relative_parts(path: str, what: str = "path") -> list[str]:
    """The components of a relative path from a job, or Refused. '.' components are
    dropped; one trailing '/' is allowed (a directory); '' means the base itself."""
    if "\x00" in path:
        raise Refused(f"{what} {path!r} contains a NUL byte")
    if path.startswith("/"):
        raise Refused(f"{what} {path!r} is absolute; a relative path was expected")
    if path in ("", "."):
        return []
    parts = path[:-1].split("/") if path.endswith("/") else path.split("/")
    if ".." in parts:
        raise Refused(f"{what} {path!r} contains '..'")
    if "" in parts:
        raise Refused(f"{what} {path!r} has an empty component ('//')")
    return [p for p in parts if p != "."]


class Root:
    """One allowed root, opened once by its configured path."""

    def __init__(self, path: str):
        self.path = os.path.normpath(path)
        self.real = os.path.realpath(path)
        self._fd: int | None = None
        self._lock = threading.Lock()

    @classmethod
    def opened(cls, path: str, fd: int) -> Root:
        """A root that is an already opened directory (it owns `fd` from now on)."""
        root = cls.__new__(cls)
        root.path = root.real = os.path.normpath(path)
        root._fd = fd
        root._lock = threading.Lock()
        return root

    def fd(self) -> int:
        # Locked: the files of a replica are opened from one Tree by several threads, and
        # two first calls at once would open the root twice and leak a descriptor.
        with self._lock:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            return self._fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def within(self, path: str) -> str | None:
        """The rest of absolute `path` below this root ('' for the root), else None."""
        for prefix in dict.fromkeys((self.path, self.real)):
            if path == prefix:
                return ""
            top = prefix.rstrip("/") + "/"
            if path.startswith(top):
                return path[len(top) :]
        return None


@dataclass(frozen=True)
class Place:
    """A path inside one root, as components below it (never resolved by the kernel)."""

    tree: Tree
    root: Root
    parts: tuple[str, ...]

    def join(self, relative: str, what: str = "path") -> Place:
        return Place(self.tree, self.root, self.parts + tuple(relative_parts(relative, what)))

    @property
    def name(self) -> str:
        return self.parts[-1] if self.parts else ""

    @property
    def parent(self) -> Place:
        return Place(self.tree, self.root, self.parts[:-1])

    def __str__(self) -> str:
        return "/".join((self.root.path.rstrip("/"), *self.parts)) or "/"


class Tree:
    """The allowed roots of a project (or a worker's own scratch root). Use as a context
    manager: it holds the roots' descriptors open."""

    def __init__(self, roots: Iterable[str]):
        self.roots = sorted(
            (Root(r) for r in roots if isinstance(r, str) and r.startswith("/")),
            key=lambda r: len(r.path),
            reverse=True,  # the most specific root first
        )

    def __enter__(self) -> Tree:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for root in self.roots:
            root.close()

    def subtree(self, place: Place) -> Tree:
        """A Tree whose only root is the directory at `place` (walked to as open_dir
        does): symlinks below it that lead out of it are Refused, even into other roots."""
        tree = Tree([])
        tree.roots = [Root.opened(str(place), self.open_dir(place))]
        return tree

    def describe(self) -> str:
        return ", ".join(r.path for r in self.roots) or "none"

    def locate(self, path: str, what: str = "path") -> Place:
        """The Place of an absolute path under one of the roots, or Refused."""
        if not self.roots:
            raise Refused(
                "no allowed root directories are configured, so no file may be used", "outside"
            )
        if not isinstance(path, str) or "\x00" in path:
            raise Refused(f"{what} {path!r} contains a NUL byte")
        if not path.startswith("/"):
            raise Refused(f"{what} {path!r} is not an absolute path")
        if ".." in path.split("/"):
            raise Refused(f"{what} {path} is not an absolute path without '..'")
        clean = path.rstrip("/") or "/"
        for root in self.roots:
            rest = root.within(clean)
            if rest is not None:
                return Place(self, root, tuple(relative_parts(rest, what)))
        raise Refused(f"{what} {path} is outside the allowed roots ({self.describe()})", "outside")

    # -- the walk ------------------------------------------------------------------------

    def _expand(self, place_root: Root, done: list[str], target: str, where: str):
        """Where a symlink found at `done`/<link> with `target` leads: (root, parts)."""
        if "\x00" in target:
            raise Refused(f"{where} is a symlink with an invalid target", "symlink")
        if target.startswith("/"):
            try:
                found = self.locate(os.path.normpath(target))
            except Refused:
                raise Refused(
                    f"{where} leads by a symlink to {target}, outside the allowed roots "
                    f"({self.describe()}); it was not followed",
                    "symlink",
                ) from None
            return found.root, list(found.parts)
        parts = list(done)
        for part in target.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if not parts:
                    raise Refused(
                        f"{where} leads by a symlink to {target}, out of the allowed root "
                        f"{place_root.path}; it was not followed",
                        "symlink",
                    )
                parts.pop()
            else:
                parts.append(part)
        return place_root, parts

    def _at(
        self,
        place: Place,
        last: Callable[[int, str], T],
        *,
        follow_last: bool = True,
        create_dirs: bool = False,
    ) -> T:
        """Walks to the directory holding `place`'s last component and returns
        last(dir_fd, name) (name '' when `place` is a root). Directories on the way are
        opened with O_DIRECTORY|O_NOFOLLOW; in-root symlinks are resolved here. When
        follow_last and `last` fails with ELOOP (a symlink, since it opens with
        O_NOFOLLOW), that symlink is resolved too and `last` is tried on its target."""
        done: list[str]
        root, pending, done = place.root, list(place.parts), []
        links = 0
        fd = os.dup(root.fd())
        try:
            while True:
                if not pending:
                    return last(fd, "")
                name = pending[0]
                where = "/".join((root.path.rstrip("/"), *done, name))
                if len(pending) == 1:
                    try:
                        return last(fd, name)
                    except OSError as exc:
                        if not follow_last or exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                            raise
                        target = _readlink(fd, name)
                        if target is None:
                            raise
                else:
                    try:
                        child = os.open(name, O_DIR, dir_fd=fd)
                    except FileNotFoundError:
                        if not create_dirs:
                            raise
                        links += 1  # bounds a directory removed as fast as it is made
                        if links > MAX_LINKS:
                            raise
                        with contextlib.suppress(FileExistsError):
                            os.mkdir(name, 0o755, dir_fd=fd)
                        continue  # open what is there now (it may be a symlink)
                    except OSError as exc:
                        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                            raise
                        target = _readlink(fd, name)
                        if target is None:
                            raise NotADirectoryError(
                                errno.ENOTDIR, f"{where} is not a directory"
                            ) from None
                    else:
                        os.close(fd)
                        fd = child
                        done.append(name)
                        pending.pop(0)
                        continue
                links += 1
                if links > MAX_LINKS:
                    raise Refused(f"{place} goes through more than {MAX_LINKS} symlinks", "symlink")
                root, base = self._expand(root, done, target, where)
                pending = base + pending[1:]
                done = []
                os.close(fd)
                fd = os.dup(root.fd())
        finally:
            os.close(fd)

    # -- reads ---------------------------------------------------------------------------

    def open_read(self, place: Place) -> int:
        """A descriptor of the regular file at `place`, opened for reading (the caller
        closes it). A FIFO or device is refused without blocking on it."""

        def opener(dir_fd: int, name: str) -> int:
            if not name:
                raise IsADirectoryError(errno.EISDIR, f"{place} is a directory")
            fd = os.open(
                name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd
            )
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise Refused(f"{place} is not a regular file", "type")
            os.set_blocking(fd, True)
            return fd

        return self._at(place, opener)

    def stat(self, place: Place) -> os.stat_result:
        """stat of what `place` names, in-root symlinks resolved (never the kernel's)."""

        def lstat(dir_fd: int, name: str) -> os.stat_result:
            info = os.stat(name or ".", dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                raise OSError(errno.ELOOP, "symlink", name)
            return info

        return self._at(place, lstat)

    def open_dir(self, place: Place, *, create: bool = False) -> int:
        """A descriptor of the directory at `place` (the caller closes it); with
        `create`, missing directories on the way and at the end are made."""

        def opener(dir_fd: int, name: str) -> int:
            if not name:
                return os.dup(dir_fd)
            try:
                return os.open(name, O_DIR, dir_fd=dir_fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=dir_fd)
                return os.open(name, O_DIR, dir_fd=dir_fd)

        return self._at(place, opener, create_dirs=create)

    # -- writes --------------------------------------------------------------------------

    def create_file(self, place: Place, *, replace: bool = False, mode: int = 0o644) -> int:
        """A new regular file at `place` opened for writing (parents made as needed).
        Exclusive unless `replace`, which truncates an existing regular file; a symlink
        at `place` is never written through."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        flags |= os.O_TRUNC if replace else os.O_EXCL

        def opener(dir_fd: int, name: str) -> int:
            if not name:
                raise IsADirectoryError(errno.EISDIR, f"{place} is a directory")
            try:
                return os.open(name, flags, mode, dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise Refused(
                        f"{place} is a symlink; it is not written through", "type"
                    ) from None
                raise

        return self._at(place, opener, follow_last=False, create_dirs=True)

    def rename(self, src: Place, dst: Place) -> None:
        """Moves the entry `src` to `dst` (replacing a file or an empty directory there),
        both names resolved under the roots; the entries themselves are never followed."""
        src_fd = self._at(src, _dup_parent, follow_last=False)
        try:

            def move(dst_fd: int, name: str) -> None:
                if not name or not src.name:
                    raise Refused("a root cannot be renamed, or replaced")
                os.rename(src.name, name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)

            self._at(dst, move, follow_last=False, create_dirs=True)
        finally:
            os.close(src_fd)

    def mkdir(self, place: Place, mode: int = 0o700) -> None:
        """A new directory at `place` (FileExistsError if anything is there)."""

        def make(dir_fd: int, name: str) -> None:
            if not name:
                raise FileExistsError(errno.EEXIST, f"{place} is a root")
            os.mkdir(name, mode, dir_fd=dir_fd)

        self._at(place, make, follow_last=False, create_dirs=True)

    # -- deletes -------------------------------------------------------------------------

    def lstat(self, place: Place) -> os.stat_result:
        """stat of the entry `place` itself (a symlink is reported as one)."""
        return self._at(
            place,
            lambda d, n: os.stat(n or ".", dir_fd=d, follow_symlinks=False),
            follow_last=False,
        )

    def unlink(self, place: Place) -> None:
        """Removes the entry (a file or a symlink, never the symlink's target)."""

        def remove(dir_fd: int, name: str) -> None:
            if not name:
                raise IsADirectoryError(errno.EISDIR, f"{place} is a directory")
            os.unlink(name, dir_fd=dir_fd)

        self._at(place, remove, follow_last=False)

    def rmdir(self, place: Place) -> None:
        """Removes the directory if it is empty (OSError otherwise)."""

        def remove(dir_fd: int, name: str) -> None:
            if not name:
                raise Refused("a root is never removed")
            os.rmdir(name, dir_fd=dir_fd)

        self._at(place, remove, follow_last=False)

    def remove_tree(self, place: Place, *, missing_ok: bool = True) -> None:
        """Removes the entry and, if it is a directory, everything below it, following
        no symlink (shutil.rmtree walking with directory descriptors)."""

        def remove(dir_fd: int, name: str) -> None:
            if not name:
                raise Refused("a root is never removed")
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                shutil.rmtree(name, dir_fd=dir_fd)
            else:
                os.unlink(name, dir_fd=dir_fd)

        try:
            self._at(place, remove, follow_last=False)
        except FileNotFoundError:
            if not missing_ok:
                raise


def _dup_parent(dir_fd: int, name: str) -> int:
    return os.dup(dir_fd)


def _readlink(dir_fd: int, name: str) -> str | None:
    """The target of the symlink `name`, or None if it is not one (or is gone)."""
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENOENT):
            return None
        raise


def fd_path(fd: int) -> str:
    """A path naming the open descriptor `fd` itself: libraries that want a path (torch,
    safetensors) open the file that was checked, whatever happens to its name since."""
    return f"/proc/self/fd/{fd}"
