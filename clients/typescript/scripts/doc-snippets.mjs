// Every ```ts block of docs/typescript.md becomes test/doc-snippets/NN.ts, a module whose default
// export runs the block, so that `tsc` type-checks each one and test/docs.test.ts runs it against
// the service. A block's leading imports stay at the top; `BASE_URL` and `TOKEN` are given.
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("..", import.meta.url));
const doc = join(root, "..", "..", "docs", "typescript.md");
const out = join(root, "test", "doc-snippets");

const blocks = [...readFileSync(doc, "utf8").matchAll(/^```ts\n([\s\S]*?)^```/gm)].map((m) => m[1]);
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
blocks.forEach((block, index) => {
  const lines = block.split("\n");
  // the imports end with the last line that ends an import statement (`... from "x";`)
  const split = lines.findLastIndex((line) => /(^import\s|\sfrom\s)["'][^"']+["'];$/.test(line)) + 1;
  const imports = lines.slice(0, split).join("\n");
  const body = lines.slice(split).map((line) => (line ? `  ${line}` : line)).join("\n");
  const source = [
    `// Generated from docs/typescript.md (block ${index + 1}) by scripts/doc-snippets.mjs.`,
    imports,
    "export default async function run(BASE_URL: string, TOKEN: string): Promise<void> {",
    "  void BASE_URL, TOKEN;",
    body,
    "}",
    "",
  ].join("\n");
  writeFileSync(join(out, `${String(index + 1).padStart(2, "0")}.ts`), source);
});
console.log(`${blocks.length} blocks of docs/typescript.md in test/doc-snippets/`);
