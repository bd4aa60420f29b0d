// Compile tests/security/Reenter.sol into tests/security/reenter.json (solc-js from node_modules).
// Usage, from the repository root: node tests/security/build_reenter.js
const solc = require("../../node_modules/solc");
const fs = require("fs");
const path = require("path");
const crypto = require("crypto");
const src = fs.readFileSync(path.join(__dirname, "Reenter.sol"), "utf8");
const input = {
  language: "Solidity",
  sources: { "Reenter.sol": { content: src } },
  settings: { evmVersion: "cancun", optimizer: { enabled: true, runs: 200 },
    outputSelection: { "*": { "*": ["abi", "evm.bytecode.object"] } } },
};
const out = JSON.parse(solc.compile(JSON.stringify(input)));
const errors = (out.errors || []).filter((e) => e.severity === "error");
if (errors.length) { for (const e of errors) console.error(e.formattedMessage); process.exit(1); }
const c = out.contracts["Reenter.sol"].Reenter;
const art = { contractName: "Reenter", compiler: solc.version(), evmVersion: "cancun",
  sourceSha256: crypto.createHash("sha256").update(src).digest("hex"),
  abi: c.abi, bytecode: "0x" + c.evm.bytecode.object };
fs.writeFileSync(path.join(__dirname, "reenter.json"), JSON.stringify(art, null, 1) + "\n");
console.log("wrote tests/security/reenter.json");
