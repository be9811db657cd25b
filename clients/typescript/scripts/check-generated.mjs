// The types in src/generated/openapi.ts are generated from the service's openapi.yaml by
// openapi-typescript. Without arguments: generate them again into a temporary file and fail,
// with the first differing line, when the committed file is not what the contract gives
// (`npm run generate` then brings it up to date). With --write: write them in place.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("..", import.meta.url));
const contract = join(root, "..", "..", "openapi.yaml");
const committed = join(root, "src", "generated", "openapi.ts");
const cli = join(root, "node_modules", "openapi-typescript", "bin", "cli.js");

function generate(output) {
  // Only request bodies have defaults in this contract: they stay optional fields to send.
  execFileSync(
    process.execPath,
    [cli, contract, "--default-non-nullable", "false", "--output", output],
    { stdio: ["ignore", "ignore", "inherit"] },
  );
}

if (process.argv.includes("--write")) {
  generate(committed);
  console.log(`wrote ${committed}`);
} else {
  const dir = mkdtempSync(join(tmpdir(), "cms-openapi-ts-"));
  try {
    const fresh = join(dir, "openapi.ts");
    generate(fresh);
    const want = readFileSync(fresh, "utf8").split("\n");
    const have = readFileSync(committed, "utf8").split("\n");
    const line = want.findIndex((text, i) => text !== have[i]);
    if (line !== -1 || want.length !== have.length) {
      const at = line === -1 ? Math.min(want.length, have.length) : line;
      console.error(
        `src/generated/openapi.ts is not what openapi.yaml gives (line ${at + 1}):\n` +
          `  committed: ${JSON.stringify(have[at])}\n  generated: ${JSON.stringify(want[at])}\n` +
          "run `npm run generate` in clients/typescript",
      );
      process.exit(1);
    }
    console.log("src/generated/openapi.ts matches openapi.yaml");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
