// llama3_ref.mjs - the independent side of tests/io/test_llama3.c: Llama 3's tokenizer
// files and reference encodings, from two npm packages that share no code with weft.
//
//  - llama3-tokenizer-js (belladore.ai): Llama 3's vocabulary and merges as Hugging Face's
//    tokenizer.json has them, and an encoder that follows that file (merge priority queue,
//    ignore_merges, the pre-tokenizer regex as a JavaScript RegExp);
//  - js-tiktoken: a port of OpenAI's tiktoken (rank-ordered byte-pair merging), with
//    cl100k_base's ranks.
//
// It writes, into OUT:
//  - tokenizer.model: Llama 3's ranks in tiktoken's format ("BASE64 RANK" per line), the
//    file Meta ships, rebuilt from llama3-tokenizer-js's vocabulary (ids are ranks; token
//    strings are in GPT-2's byte alphabet, turned back into bytes here);
//  - cl100k_base.tiktoken: js-tiktoken's cl100k_base ranks in the same format;
//  - tokenizer.json: the same vocabulary as Hugging Face's Llama 3 tokenizer.json writes it
//    (the package's vocabulary, merges in its order, its specials as added_tokens, the
//    pre-tokenizer regex as the package quotes it from that file, ignore_merges, the
//    template that starts a text with <|begin_of_text|>);
//  - specials.txt: the package's 256 special tokens, one per line, from id 128000;
//  - cases.bin: the texts and their ids, little-endian uint32s: the case count, then per
//    case its byte length and bytes, the ids of llama3-tokenizer-js, of js-tiktoken run
//    with Llama 3's ranks, pattern and specials, and of js-tiktoken's cl100k_base (count
//    0xFFFFFFFF when the text holds "<|", which cl100k_base and Llama 3 treat apart).
// and prints one line of figures; it fails when the two encoders disagree on any text or
// the two vocabularies on any of cl100k_base's ranks. Texts: each fortune (the "%"-separated entries) of
// the files named on the command line, and a built-in set of edge cases.
//
// usage: node llama3_ref.mjs NODE_MODULES OUT [FORTUNES_DIR]
//   FORTUNES_DIR: /usr/share/games/fortunes with Debian's fortunes, fortunes-zh and
//   fortunes-ru installed: every English file, two Chinese ones and three Russian ones.
//   Without it only the tokenizer files are written (docs/tokenizers.md uses that).
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { N_RANKS, writeTokenizerModel } from '../../scripts/llama3-tokenizer.mjs';

const [nodeModules, out, fortunes] = process.argv.slice(2);
const zh = ['chinese', 'tang300', 'song100'];
const corpus = !fortunes ? [] : fs.readdirSync(fortunes).sort()
  .filter((f) => !/\.(dat|u8)$/.test(f) && !zh.includes(f) && fs.statSync(path.join(fortunes, f)).isFile())
  .concat(['tang300', 'song100', 'ru/2001.03', 'ru/2001.04', 'ru/2001.05'])
  .map((f) => path.join(fortunes, f));
const load = (p) => import(pathToFileURL(path.join(nodeModules, p)).href);
const llama3 = (await load('llama3-tokenizer-js/bundle/llama3-tokenizer-with-baked-data.js')).default;
const { Tiktoken } = await load('js-tiktoken/dist/lite.js');
const cl100k = (await load('js-tiktoken/dist/ranks/cl100k_base.js')).default;

const vocab = llama3.vocabById;
const l3ranks = writeTokenizerModel(vocab, path.join(out, 'tokenizer.model'));
const specials = vocab.slice(N_RANKS);
fs.writeFileSync(path.join(out, 'specials.txt'), specials.join('\n') + '\n');

// Hugging Face's form. The regex is the string the package's source quotes.
const bundle = fs.readFileSync(path.join(nodeModules, 'llama3-tokenizer-js/bundle/llama3-tokenizer-with-baked-data.js'), 'utf8');
const regex = JSON.parse(bundle.match(/DIRTY_LLAMA3_REGEX_STRING = ("(?:[^"\\]|\\.)*")/)[1]);
const bos = { SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } };
fs.writeFileSync(path.join(out, 'tokenizer.json'), JSON.stringify({
  version: '1.0', truncation: null, padding: null,
  added_tokens: specials.map((content, i) => ({ id: N_RANKS + i, content, single_word: false,
    lstrip: false, rstrip: false, normalized: false, special: true })),
  normalizer: null,
  pre_tokenizer: { type: 'Sequence', pretokenizers: [
    { type: 'Split', pattern: { Regex: regex }, behavior: 'Isolated', invert: false },
    { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] },
  post_processor: { type: 'Sequence', processors: [
    { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    { type: 'TemplateProcessing', single: [bos, { Sequence: { id: 'A', type_id: 0 } }],
      pair: [bos, { Sequence: { id: 'A', type_id: 0 } }, bos, { Sequence: { id: 'B', type_id: 1 } }],
      special_tokens: { '<|begin_of_text|>': { id: '<|begin_of_text|>', ids: [N_RANKS], tokens: ['<|begin_of_text|>'] } } }] },
  decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
    end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: true,
    vocab: Object.fromEntries(vocab.slice(0, N_RANKS).map((s, i) => [s, i])),
    merges: [...llama3.merges.keys()] },
}));

const clranks = [];
for (const line of cl100k.bpe_ranks.split('\n').filter(Boolean)) {
  const [, offset, ...toks] = line.split(' ');
  toks.forEach((t, i) => { clranks[Number(offset) + i] = t; });
}
fs.writeFileSync(path.join(out, 'cl100k_base.tiktoken'), clranks.map((b, r) => `${b} ${r}\n`).join(''));
let shared = 0;
while (shared < clranks.length && clranks[shared] === l3ranks[shared]) shared++;
if (!fortunes) {
  console.log(`wrote ${path.join(out, 'tokenizer.model')} and tokenizer.json (Llama 3), cl100k_base.tiktoken`);
  process.exit(0);
}

// js-tiktoken with Llama 3's ranks: cl100k_base's pattern (Llama 3's, its case-insensitive
// group spelled out for JavaScript) and Llama 3's specials after the ranks.
const tiktokenLlama3 = new Tiktoken({
  pat_str: cl100k.pat_str,
  special_tokens: Object.fromEntries(specials.map((s, i) => [s, N_RANKS + i])),
  bpe_ranks: `! 0 ${l3ranks.join(' ')}`,
});
const tiktokenCl100k = new Tiktoken(cl100k);

// The texts: every fortune, then edge cases (scripts, digits, whitespace runs, CRLF,
// contractions in any case, specials, emoji with joiners, combining marks).
const cases = [];
let lines = 0;
for (const f of corpus) {
  for (const entry of fs.readFileSync(f, 'utf8').split(/\n%\n/)) {
    if (entry.length === 0) continue;
    cases.push(entry + '\n');
    lines += entry.split('\n').length;
  }
}
const edge = [
  "Hello world!", "I'm sure you're right, they'll've DON'T I'LL We'Re", "it's 'tis o'clock ''s",
  "1234567890 3.14159 1,000,000 x2 2x 12ab34", "    leading and trailing    ", "a  b   c    d\t\te",
  "line one\r\nline two\r\n\r\n\n\n  \n", "tabs\t\t\tand\u00a0no-break\u2003em\u3000ideographic",
  "Ünïcödé façade naïve café résumé", "Привет, мир! Как дела?", "你好，世界。今天天气很好。",
  "こんにちは世界、カタカナ", "안녕하세요 세계", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया",
  "emoji 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ 🤖", "e\u0301 a\u0308 combining", "math ∑∫√∞ ≠ ≤ ≥ → ⇒",
  "<|begin_of_text|>Hello<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
  "not special: <|begin_of_text| and <|nope|> and <|end_of_text|>x",
  "code: for (int i = 0; i < n; i++) { x += a[i] * b[i]; }\n    return x;\n",
  "URL https://example.org/a/b?c=d&e=f#g and e-mail a.b@c.de", "$$$ !!! ??? ... --- ___ ***",
  "", " ", "\n", "\t", "a", "ab", "'", "'s", " 's", "999999", "x".repeat(300), " ".repeat(50) + "x",
];
for (const e of edge) cases.push(e);

const parts = [];
const u32 = (v) => { const b = Buffer.alloc(4); b.writeUInt32LE(v >>> 0); parts.push(b); };
const ids = (a) => { u32(a.length); const b = Buffer.alloc(4 * a.length); a.forEach((x, i) => b.writeUInt32LE(x, 4 * i)); parts.push(b); };
u32(cases.length);
let tokens = 0, disagree = 0;
for (const text of cases) {
  const bytes = Buffer.from(text, 'utf8');
  u32(bytes.length);
  parts.push(bytes);
  const a = llama3.encode(text, { bos: false, eos: false });
  const b = tiktokenLlama3.encode(text, 'all');
  if (a.length !== b.length || a.some((x, i) => x !== b[i])) disagree++;
  ids(a);
  ids(b);
  if (text.includes('<|')) u32(0xffffffff);
  else ids(tiktokenCl100k.encode(text, [], []));
  tokens += a.length;
}
fs.writeFileSync(path.join(out, 'cases.bin'), Buffer.concat(parts));
console.log(`reference: ${cases.length} texts (${lines} fortune lines, ${edge.length} edge cases), ` +
  `${tokens} Llama 3 tokens; llama3-tokenizer-js and js-tiktoken disagree on ${disagree} texts; ` +
  `cl100k_base's ${clranks.length} ranks equal Llama 3's first ${shared}`);
if (disagree > 0 || shared !== clranks.length) process.exit(1); // the references must agree
