#!/usr/bin/env python3
"""Regenerate the chat-template reference renderings in this folder.

Run from anywhere: python3 runtime/chat/testdata/gen_refs.py
Needs only the standard library and jinja2 (3.1.x).

1. Extracts tokenizer.chat_template (and the BOS/EOS token text) from the
   vocab GGUF files in <shared>/testdata/vocab into <family>.jinja and
   <family>.tokens.json. <shared> is $ATS_SHARED, or ../shared beside the
   module root (as internal/testenv finds it).
2. Renders every conversation of cases.json the way HF transformers'
   apply_chat_template does, with each model template into
   <family>.<case>.txt and with each of ats's built-in fallback templates
   (../templates/*.jinja) into fallback-<family>.<case>.txt.
3. Renders tojson.jinja with the variables of tojson_vars.json into
   tojson.txt (HF's tojson filter with its options), and whitespace.jinja
   (whitespace-control corner cases) into whitespace.txt.

The Go test (chat_test.go) renders the same cases and must match these files
byte for byte.
"""
import json
import os
import struct
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.environ.get("ATS_SHARED") or os.path.join(HERE, "..", "..", "..", "..", "shared")
VOCAB = os.path.join(SHARED, "testdata", "vocab")
MODELS = {"qwen3": "vocab-qwen3.gguf", "llama3": "vocab-llama3.gguf"}


# --- minimal GGUF metadata reader (v2/v3, little endian) ---------------------

_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?",
           10: "Q", 11: "q", 12: "d"}


def _rd(f, fmt):
    return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]


def _rstr(f):
    return f.read(_rd(f, "Q")).decode("utf-8")


def _rval(f, t):
    if t == 8:
        return _rstr(f)
    if t == 9:
        et, n = _rd(f, "I"), _rd(f, "Q")
        return [_rval(f, et) for _ in range(n)]
    return _rd(f, _SCALAR[t])


def gguf_metadata(path):
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            sys.exit(f"{path}: not a GGUF file")
        _rd(f, "I")  # version
        _rd(f, "Q")  # tensor count
        n_kv = _rd(f, "Q")
        meta = {}
        for _ in range(n_kv):
            key = _rstr(f)
            meta[key] = _rval(f, _rd(f, "I"))
        return meta


# --- HF transformers' chat-template environment ------------------------------
# Mirrors transformers.utils.chat_template_utils._compile_jinja_template.

def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def compile_template(src):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(src)


# --- conversion of cases.json messages, as ats does it -----------------------

def _sorted(x):
    """Go maps have no order; ats hands tools to the template with keys sorted."""
    if isinstance(x, dict):
        return {k: _sorted(x[k]) for k in sorted(x)}
    if isinstance(x, list):
        return [_sorted(v) for v in x]
    return x


def hf_message(m):
    """The dict the template sees for one ats chat.Message (see chat.go)."""
    out = {"role": m["role"], "content": m.get("content", "")}
    if m.get("reasoning_content"):
        out["reasoning_content"] = m["reasoning_content"]
    if m.get("tool_calls"):
        calls = []
        for c in m["tool_calls"]:
            fn = c["function"]
            args = fn.get("arguments", "")
            try:
                parsed = json.loads(args)
                if isinstance(parsed, dict):
                    args = parsed  # insertion order kept, like ats
            except ValueError:
                pass
            call = {}
            if c.get("id"):
                call["id"] = c["id"]
            call["type"] = c.get("type") or "function"
            call["function"] = {"name": fn["name"], "arguments": args}
            calls.append(call)
        out["tool_calls"] = calls
    if m.get("tool_call_id"):
        out["tool_call_id"] = m["tool_call_id"]
    if m.get("name"):
        out["name"] = m["name"]
    return out


def render_cases(name, src, special, cases):
    tmpl = compile_template(src)
    for case in cases:
        kwargs = dict(special)
        kwargs.update(case.get("vars", {}))
        tools = case.get("tools")
        out = tmpl.render(
            messages=[hf_message(m) for m in case["messages"]],
            tools=_sorted(tools) if tools else None,
            documents=None,
            add_generation_prompt=case.get("add_generation_prompt", False),
            **kwargs,
        )
        path = os.path.join(HERE, f"{name}.{case['name']}.txt")
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(out)
        print("wrote", os.path.relpath(path, HERE))


# Special tokens for the fallback renderings (the Go test uses the same).
FALLBACK_TOKENS = {
    "chatml": {"bos_token": "", "eos_token": "<|im_end|>"},
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "glm4": {"bos_token": "", "eos_token": "<|endoftext|>"},
}


def main():
    with open(os.path.join(HERE, "cases.json"), encoding="utf-8") as f:
        cases = json.load(f)
    for family, fname in MODELS.items():
        meta = gguf_metadata(os.path.join(VOCAB, fname))
        src = meta["tokenizer.chat_template"]
        tokens = meta["tokenizer.ggml.tokens"]

        def tok(key):
            i = meta.get(key)
            return tokens[i] if i is not None else ""

        special = {"bos_token": tok("tokenizer.ggml.bos_token_id"),
                   "eos_token": tok("tokenizer.ggml.eos_token_id")}
        with open(os.path.join(HERE, family + ".jinja"), "w", encoding="utf-8", newline="") as f:
            f.write(src)
        with open(os.path.join(HERE, family + ".tokens.json"), "w", encoding="utf-8") as f:
            json.dump(special, f, ensure_ascii=False, indent=1)
            f.write("\n")
        render_cases(family, src, special, cases)

    for family, special in FALLBACK_TOKENS.items():
        path = os.path.join(HERE, "..", "templates", family + ".jinja")
        with open(path, encoding="utf-8", newline="") as f:
            src = f.read()
        render_cases("fallback-" + family, src, special, cases)

    with open(os.path.join(HERE, "tojson.jinja"), encoding="utf-8", newline="") as f:
        tmpl = compile_template(f.read())
    with open(os.path.join(HERE, "tojson_vars.json"), encoding="utf-8") as f:
        tvars = json.load(f)
    with open(os.path.join(HERE, "tojson.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(tmpl.render(**tvars))
    print("wrote tojson.txt")

    with open(os.path.join(HERE, "whitespace.jinja"), encoding="utf-8", newline="") as f:
        tmpl = compile_template(f.read())
    with open(os.path.join(HERE, "whitespace.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(tmpl.render(x="X", items=[1, 2, 3]))
    print("wrote whitespace.txt")


if __name__ == "__main__":
    main()
