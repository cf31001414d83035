// The independent checker for lockstep's tokenizers: Hugging Face's tokenizers.js (pure
// JavaScript) loads a tokenizer.json and encodes texts.
//   node oracle.mjs encode TOKENIZER_JSON TEXTS_JSON
//     TEXTS_JSON is a JSON array of strings; prints {"ids": [[...], ...], "decoded": [...]}, the
//     decoded texts without clean-up of spaces (decode(ids, {clean_up_tokenization_spaces: false})).
//   node oracle.mjs time TOKENIZER_JSON TEXTS_JSON|FORTUNES_DIR
//     encodes every text once, timed; prints {"seconds": S, "texts": N, "tokens": T}. A directory
//     is read as lockstep's TextCorpusFormat::kFortunes does: every file without an extension, in
//     name order; entries between lines holding only '%', inner newlines kept, empty ones skipped.
import { readFileSync, readdirSync, statSync, lstatSync } from "node:fs";
import { join } from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";

const [mode, tokenizerPath, textsPath] = process.argv.slice(2);
if (!["encode", "time"].includes(mode) || !textsPath) {
  console.error("usage: node oracle.mjs encode|time TOKENIZER_JSON TEXTS_JSON");
  process.exit(2);
}
const tokenizer = new Tokenizer(JSON.parse(readFileSync(tokenizerPath, "utf8")), {});
const readFortunes = (dir) => {
  const entries = [];
  const names = readdirSync(dir).filter((n) => !n.includes(".") && lstatSync(join(dir, n)).isFile()).sort();
  for (const name of names) {
    const lines = readFileSync(join(dir, name), "utf8").split("\n");
    if (lines.at(-1) === "") lines.pop();  // the newline that ends the last line
    let entry = [];
    const finish = () => {
      const text = entry.join("\n");
      if (text.length) entries.push(text);
      entry = [];
    };
    for (const line of lines) line === "%" ? finish() : entry.push(line);
    finish();
  }
  return entries;
};
const texts = statSync(textsPath).isDirectory() ? readFortunes(textsPath) : JSON.parse(readFileSync(textsPath, "utf8"));
const encode = (text) => tokenizer.encode(text, { add_special_tokens: false }).ids;

if (mode === "time") {
  const start = process.hrtime.bigint();
  let tokens = 0;
  for (const text of texts) tokens += encode(text).length;
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  console.log(JSON.stringify({ seconds, texts: texts.length, tokens }));
} else {
  const ids = texts.map(encode);
  const decoded = ids.map((i) => (i.length ? tokenizer.decode(i, { clean_up_tokenization_spaces: false }) : ""));
  console.log(JSON.stringify({ ids, decoded }));
}
