// llama3-tokenizer.mjs - Llama 3's tokenizer.model, the file Meta ships with the model
// (tiktoken's format: one "BASE64 RANK" line per token, ranks 0..127999 in order; the 256
// special tokens follow the ranks and are not in the file), rebuilt from npm's
// llama3-tokenizer-js, which carries Llama 3's vocabulary as Hugging Face's tokenizer.json
// has it: token strings in GPT-2's byte alphabet, whose characters stand for bytes.
//
// usage: node scripts/llama3-tokenizer.mjs PACKAGE_DIR OUT_FILE
//   PACKAGE_DIR: the package's folder (`npm pack llama3-tokenizer-js@1.2.0`, unpacked);
//   scripts/setup.sh writes data/llama3/tokenizer.model this way.
// tests/io/llama3_ref.mjs imports tokenizerModelRanks for the tokenizer test.
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

export const N_RANKS = 128000;

// GPT-2's bytes_to_unicode(): the byte each character of the alphabet stands for.
function byteAlphabet() {
  const byteOf = new Map(), keep = [];
  for (let b = 0; b < 256; b++)
    if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)) keep.push(b);
  let n = 0;
  for (let b = 0; b < 256; b++)
    byteOf.set(String.fromCharCode(keep.includes(b) ? b : 256 + n++), b);
  return byteOf;
}

// The base64 of each rank's bytes, from the package's vocabulary (vocabById: 128256 token
// strings, ranks first, then the specials).
export function tokenizerModelRanks(vocabById) {
  if (vocabById.length !== N_RANKS + 256)
    throw new Error(`llama3-tokenizer-js has ${vocabById.length} tokens, expected 128256`);
  const byteOf = byteAlphabet();
  return vocabById.slice(0, N_RANKS).map((s) => Buffer.from([...s].map((c) => {
    if (!byteOf.has(c)) throw new Error(`token '${s}' is not in GPT-2's byte alphabet`);
    return byteOf.get(c);
  })).toString('base64'));
}

export function writeTokenizerModel(vocabById, file) {
  const ranks = tokenizerModelRanks(vocabById);
  fs.writeFileSync(file, ranks.map((b, r) => `${b} ${r}\n`).join(''));
  return ranks;
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const [pkg, out] = process.argv.slice(2);
  if (!pkg || !out) {
    console.error('usage: node scripts/llama3-tokenizer.mjs PACKAGE_DIR OUT_FILE');
    process.exit(2);
  }
  const bundle = path.resolve(pkg, 'bundle/llama3-tokenizer-with-baked-data.js');
  const llama3 = (await import(pathToFileURL(bundle).href)).default;
  writeTokenizerModel(llama3.vocabById, out + '.tmp');
  fs.renameSync(out + '.tmp', out);
}
