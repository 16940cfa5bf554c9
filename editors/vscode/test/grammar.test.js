// The TextMate grammar (syntaxes/qrun.tmLanguage.json) tokenized as VS Code tokenizes it:
// vscode-textmate with the Oniguruma regex engine (vscode-oniguruma, compiled to WebAssembly).
// samples/expectations.json lists, for a line of a sample file, a token's exact text and the
// scopes it must have (and, under "not", must not). Run: node test/grammar.test.js (npm test);
// exit status 1 with each failure on stderr. tests/editors/test_vscode_grammar.py runs it.
"use strict";

const fs = require("fs");
const path = require("path");
const oniguruma = require("vscode-oniguruma");
const textmate = require("vscode-textmate");

const root = path.resolve(__dirname, "..");
const samples = path.join(__dirname, "samples");

async function registry() {
  const wasm = fs.readFileSync(require.resolve("vscode-oniguruma/release/onig.wasm"));
  await oniguruma.loadWASM(wasm.buffer.slice(wasm.byteOffset, wasm.byteOffset + wasm.byteLength));
  return new textmate.Registry({
    onigLib: Promise.resolve({
      createOnigScanner: (patterns) => new oniguruma.OnigScanner(patterns),
      createOnigString: (text) => new oniguruma.OnigString(text),
    }),
    // The front matter embeds VS Code's own YAML grammar, which this test does not have: an
    // empty stand-in (vscode-textmate drops a rule whose embedded grammar cannot be found).
    loadGrammar: async (scopeName) => {
      if (scopeName === "source.yaml") return { scopeName, patterns: [] };
      if (scopeName !== "source.qrun") return null;
      const file = path.join(root, "syntaxes", "qrun.tmLanguage.json");
      return textmate.parseRawGrammar(fs.readFileSync(file, "utf8"), file);
    },
  });
}

function tokenize(grammar, text) {
  let state = textmate.INITIAL;
  return text.split("\n").map((line) => {
    const result = grammar.tokenizeLine(line, state);
    state = result.ruleStack;
    return result.tokens.map((t) => ({
      text: line.slice(t.startIndex, t.endIndex), scopes: t.scopes,
    }));
  });
}

async function main() {
  const grammar = await (await registry()).loadGrammar("source.qrun");
  const expectations = JSON.parse(fs.readFileSync(path.join(samples, "expectations.json"), "utf8"));
  const files = {};
  const failures = [];
  for (const want of expectations) {
    files[want.file] ??= tokenize(grammar, fs.readFileSync(path.join(samples, want.file), "utf8"));
    const tokens = files[want.file][want.line - 1] || [];
    const token = tokens.find((t) => t.text === want.text);
    const where = `${want.file}:${want.line} ${JSON.stringify(want.text)}`;
    if (!token) {
      failures.push(`${where}: no such token; the line's tokens: ` +
        JSON.stringify(tokens.map((t) => t.text)));
      continue;
    }
    const missing = want.scopes.filter((s) => !token.scopes.includes(s));
    const extra = (want.not || []).filter((s) => token.scopes.includes(s));
    if (missing.length || extra.length) {
      failures.push(`${where}: scopes ${JSON.stringify(token.scopes)}` +
        (missing.length ? `, missing ${JSON.stringify(missing)}` : "") +
        (extra.length ? `, unwanted ${JSON.stringify(extra)}` : ""));
    }
  }
  // Every sample file tokenizes to its end without the grammar being left inside a tag.
  for (const file of fs.readdirSync(samples).filter((f) => f.endsWith(".tmpl"))) {
    const lines = files[file] ?? tokenize(grammar, fs.readFileSync(path.join(samples, file), "utf8"));
    const last = lines.filter((tokens) => tokens.length).pop() || [];
    const open = last.length ? last[last.length - 1].scopes.filter((s) => s.startsWith("meta.tag")) : [];
    if (open.length && !/}}|%}/.test(last[last.length - 1].text)) {
      failures.push(`${file}: ends inside ${open.join(", ")}`);
    }
  }
  for (const failure of failures) console.error(`FAIL ${failure}`);
  console.log(`${expectations.length - failures.length} of ${expectations.length} expectations hold`);
  process.exit(failures.length ? 1 : 0);
}

main().catch((error) => {
  console.error(error);
  process.exit(2);
});
