#!/usr/bin/env python3
"""Render the chat template carried by each fixture vocabulary GGUF
(tokenizer.chat_template) for the conversations of templates/reference.json, with
Python jinja2 configured as transformers' apply_chat_template configures it, and the
vocabulary's own bos/eos token texts.  Run: python3 gen_vocab_reference.py FIXTURES"""
import json
import struct
import sys
from datetime import datetime
from pathlib import Path

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def read_gguf_kv(path):
    """Metadata key/values of a GGUF file (scalars, strings and arrays)."""
    f = open(path, "rb")
    magic, version, n_tensors, n_kv = struct.unpack("<4sIQQ", f.read(24))
    assert magic == b"GGUF"
    fmt = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
           11: "q", 12: "d"}

    def rstr():
        (n,) = struct.unpack("<Q", f.read(8))
        return f.read(n).decode("utf-8", "replace")

    def rval(t):
        if t == 8:
            return rstr()
        if t == 9:
            et, n = struct.unpack("<IQ", f.read(12))
            return [rval(et) for _ in range(n)]
        s = struct.calcsize("<" + fmt[t])
        return struct.unpack("<" + fmt[t], f.read(s))[0]

    kv = {}
    for _ in range(n_kv):
        k = rstr()
        (t,) = struct.unpack("<I", f.read(4))
        kv[k] = rval(t)
    return kv


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def main():
    fixtures = Path(sys.argv[1])
    ref = json.load(open(fixtures / "templates" / "reference.json"))
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime(2026, 11, 30, 12).strftime(fmt)
    out = {}
    for gguf in sorted((fixtures / "vocab").glob("*.gguf")):
        kv = read_gguf_kv(gguf)
        src = kv.get("tokenizer.chat_template")
        if src is None:
            continue
        toks = kv["tokenizer.ggml.tokens"]
        bos_id = kv.get("tokenizer.ggml.bos_token_id")
        eos_id = kv.get("tokenizer.ggml.eos_token_id")
        bos = toks[bos_id] if bos_id is not None else ""
        eos = toks[eos_id] if eos_id is not None else ""
        tmpl = env.from_string(src)
        cases = {}
        for name, conv in ref["conversations"].items():
            kwargs = {"messages": conv["messages"], "tools": conv.get("tools"),
                      "add_generation_prompt": conv.get("add_generation_prompt", True),
                      "bos_token": bos, "eos_token": eos}
            try:
                cases[name] = {"expected": tmpl.render(**kwargs)}
            except jinja2.exceptions.TemplateError as e:
                cases[name] = {"error": f"{type(e).__name__}: {e}"}
        out[gguf.name] = {"bos_token": bos, "eos_token": eos, "cases": cases}
    json.dump({"made_with": f"Python jinja2 {jinja2.__version__}, as transformers configures "
               "it; strftime_now fixed to 2026-11-30 12:00:00", "vocabs": out}, sys.stdout,
              ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
