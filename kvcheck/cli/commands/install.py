"""``kvcheck install ENGINE[==VERSION]``: install an engine's allocator sources."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser(
        "install", help="install a third-party engine's allocator sources (py files only)",
        description="Install the Python sources of a third-party engine release that a kvcheck "
                    "adapter loads (an engine generation of 'kvcheck install --list', e.g. vllm-v1 "
                    "or vllm-v0==0.4.2, or vllm==VERSION for whichever generation has that "
                    "release), into $KVCHECK_THIRDPARTY_DIR or "
                    "~/.cache/kvcheck/thirdparty/. Only the wheel's *.py files are kept; an "
                    "installed release is left alone (no network); a wheel in $KVCHECK_WHEEL_DIR "
                    "is used instead of the index. Then: kvcheck verify vllm-v0@0.4.2. Exit 0 "
                    "installed, 2 bad input or the download failed.")
    p.add_argument("engines", nargs="*", default=[], metavar="ENGINE[==VERSION]",
                   help="what to install (default: vllm-v1, vllm-v0 and nano-vllm at their "
                        "pinned versions)")
    p.add_argument("--list", action="store_true",
                   help="print each engine (or each one named), the range of releases its adapter loads, its pinned "
                        "version and which releases are installed, and exit (default: off)")
    p.set_defaults(run=run)


def run(args) -> int:
    from kvcheck.errors import UsageError
    from kvcheck.impl.thirdparty import _loader, install

    if args.list:  # every engine, or the generations the names given name
        engines = list(install.ENGINES.values())
        if args.engines:
            try:
                keys = {e.key for n in args.engines for e in install.named(n.partition("==")[0])}
            except install.InstallError as exc:
                raise UsageError(str(exc)) from None
            engines = [e for e in engines if e.key in keys]
        for engine in engines:
            env = install.environment(engine)
            have = sorted((d.name.rpartition("-")[2] for d in _loader.base_dir().glob(
                f"{engine.dist}-*") if d.is_dir() and not d.name.endswith(".partial")
                and _loader.is_installed(engine.dist_for(d.name.rpartition("-")[2]))
                and engine.supports(d.name.rpartition("-")[2])), key=install.version_key)
            print(f"{engine.key}: {engine.dist} {engine.range} (pinned {engine.pinned}) -- "
                  f"{engine.note}; installed: {', '.join(have) or 'none'}"
                  + (f"; in this environment: {env.version}" if env else ""))
        return 0
    reqs = args.engines or list(install.DEFAULT)
    try:
        for req in reqs:
            engine, version = install.parse(req)
            install.install(engine, version)
    except install.InstallError as exc:
        raise UsageError(str(exc)) from None
    return 0
