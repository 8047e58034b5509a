// Corpus sample: modern JavaScript with async, template literals, regexes and JSON.
'use strict';
import { readFile } from 'node:fs/promises';

const RE = /(?<key>[A-Za-z_$][\w$]*)\s*=\s*(?<value>"(?:[^"\\]|\\.)*"|\d+)/gu;

export async function parseConfig(path, { strict = false } = {}) {
  const text = await readFile(path, 'utf8');
  const out = Object.create(null);
  for (const { groups } of text.matchAll(RE)) {
    out[groups.key] = groups.value.startsWith('"') ? JSON.parse(groups.value) : Number(groups.value);
  }
  if (strict && Object.keys(out).length === 0) throw new TypeError(`no keys in ${path}`);
  return out;
}

class Queue extends EventTarget {
  #items = [];
  push(item) { this.#items.push(item); this.dispatchEvent(new Event('push')); return this; }
  get size() { return this.#items.length; }
}

const q = new Queue();
q.push({ id: 1, tags: ['a', 'b'], nested: { ok: true, ratio: 0.75 } }).push(null);
console.log(`${q.size} items`, 2 ** 53 - 1, 0xff_ff, 1e21, [..."héllo"].length, a?.b ?? 'default');
const html = `<div class="card">\n  <p>${'&lt;escaped&gt;'}</p>\n</div>`;
