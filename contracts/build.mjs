// Compile contracts/*.sol with the pinned solc-js (standard JSON) into contracts/build/<Name>.json.
//
// Usage: node contracts/build.mjs [--out DIR]   (from the repository root; default DIR contracts/build)
//
// evmVersion is explicit (cancun): solc's default is newer than what py-evm runs. The artifact keeps
// the ABI, creation and runtime bytecode, the compiler version and the exact settings, so a test can
// recompile and compare byte for byte.
import { createRequire } from "node:module";
import { readFileSync, readdirSync, writeFileSync, mkdirSync } from "node:fs";
import { join, dirname, basename } from "node:path";
import { fileURLToPath } from "node:url";

const require = createRequire(import.meta.url);
const here = dirname(fileURLToPath(import.meta.url));
const root = dirname(here);

let solc;
try {
  solc = require(join(root, "node_modules", "solc"));
} catch (err) {
  console.error("solc-js is not installed: run `npm ci` in the repository root (make node)");
  process.exit(1);
}

const outIdx = process.argv.indexOf("--out");
const outDir = outIdx >= 0 ? process.argv[outIdx + 1] : join(here, "build");

export const settings = {
  evmVersion: "cancun",
  viaIR: true,
  optimizer: { enabled: true, runs: 200 },
  metadata: { bytecodeHash: "none", appendCBOR: false },
  outputSelection: { "*": { "*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object"] } },
};

const sources = {};
for (const f of readdirSync(here).filter((f) => f.endsWith(".sol")).sort()) {
  sources[`contracts/${f}`] = { content: readFileSync(join(here, f), "utf8") };
}

const input = { language: "Solidity", sources, settings };
const output = JSON.parse(solc.compile(JSON.stringify(input)));
const errors = (output.errors || []).filter((e) => e.severity === "error");
for (const e of output.errors || []) console.error(e.formattedMessage);
if (errors.length > 0) process.exit(1);

// Veriloco runs VerilocoModule's functions on its own storage (fallback -> DELEGATECALL), so a client
// of Veriloco needs both ABIs: the Veriloco artifact carries their union (each entry once).
const compiled = Object.assign({}, ...Object.values(output.contracts));
const DELEGATES = { Veriloco: ["VerilocoModule", "VerilocoViews"] };
function abiOf(name) {
  const seen = new Set();
  const abi = [];
  for (const n of [name, ...(DELEGATES[name] || [])]) {
    for (const entry of compiled[n].abi) {
      const key = JSON.stringify(entry);
      if (!seen.has(key)) {
        seen.add(key);
        abi.push(entry);
      }
    }
  }
  return abi;
}

mkdirSync(outDir, { recursive: true });
for (const [file, contracts] of Object.entries(output.contracts)) {
  for (const [name, c] of Object.entries(contracts)) {
    if (!c.evm.deployedBytecode.object) continue; // abstract: part of the contracts that inherit it
    const artifact = {
      contractName: name,
      sourceName: file,
      compiler: { name: "solc-js", version: solc.version() },
      settings: { evmVersion: settings.evmVersion, viaIR: settings.viaIR, optimizer: settings.optimizer, metadata: settings.metadata },
      abi: abiOf(name),
      bytecode: "0x" + c.evm.bytecode.object,
      deployedBytecode: "0x" + c.evm.deployedBytecode.object,
    };
    const path = join(outDir, `${name}.json`);
    writeFileSync(path, JSON.stringify(artifact, null, 2) + "\n");
    console.log(`${basename(file)}:${name} -> ${path} (${c.evm.deployedBytecode.object.length / 2} bytes runtime)`);
  }
}
