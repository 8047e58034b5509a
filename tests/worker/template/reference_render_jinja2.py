"""Reference renderer: Python jinja2 configured as transformers' apply_chat_template does
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols; its tojson,
raise_exception and strftime_now). Written for servedeck's tests from transformers'
documented behaviour.

  python3 reference_render_jinja2.py --batch JOBS_JSON_FILE
      JOBS: [{"template_file": path, "context": {...}}, ...]; prints a JSON array of
      {"ok": true, "text": "..."} or {"ok": false, "error": "..."} in job order.
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    if len(sys.argv) != 3 or sys.argv[1] != "--batch":
        sys.stderr.write("usage: reference_render_jinja2.py --batch JOBS_JSON_FILE\n")
        return 2
    env = make_env()
    cache = {}
    results = []
    with open(sys.argv[2], encoding="utf-8") as f:
        jobs = json.load(f)
    for job in jobs:
        path = job["template_file"]
        if path not in cache:
            with open(path, encoding="utf-8") as t:
                cache[path] = env.from_string(t.read())
        try:
            results.append({"ok": True, "text": cache[path].render(**job["context"])})
        except Exception as e:  # noqa: BLE001 - any template failure is a result
            results.append({"ok": False, "error": type(e).__name__ + ": " + str(e)})
    sys.stdout.write(json.dumps(results, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
