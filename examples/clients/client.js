// A raw-socket AgentOS client in Node.js, with nothing but its standard
// library: HELLO, NOOP, THINK and LIST over the 17-byte-header protocol.
//
//     node examples/clients/client.js [SOCKET]
"use strict";
const net = require("net");

const MAGIC = 0x41474e54;
const socketPath = process.argv[2] || process.env.AGENTOS_SOCKET || "/run/agentos/agentos.sock";

function frame(opcode, payload) {
  const body = Buffer.from(payload, "utf8");
  const header = Buffer.alloc(17);
  header.writeUInt32LE(MAGIC, 0);
  header.writeUInt32LE(0, 4);
  header.writeUInt8(opcode, 8);
  header.writeBigUInt64LE(BigInt(body.length), 9);
  return Buffer.concat([header, body]);
}

const requests = [
  ["hello", 0xfe, ""],
  ["noop", 0x00, "ping"],
  ["think", 0x01, "What is 2+2?"],
  ["list", 0x12, ""],
];

const socket = net.createConnection(socketPath);
let buffered = Buffer.alloc(0);
let next = 0;
socket.on("connect", () => {
  for (const [, opcode, payload] of requests) socket.write(frame(opcode, payload));
});
socket.on("data", (chunk) => {
  buffered = Buffer.concat([buffered, chunk]);
  while (buffered.length >= 17) {
    if (buffered.readUInt32LE(0) !== MAGIC) throw new Error("bad magic in a reply");
    const length = Number(buffered.readBigUInt64LE(9));
    if (buffered.length < 17 + length) break;
    const payload = buffered.subarray(17, 17 + length).toString("utf8");
    buffered = buffered.subarray(17 + length);
    console.log(`${requests[next][0]} ${payload}`);
    if (++next === requests.length) socket.end();
  }
});
socket.on("error", (err) => {
  console.error(`cannot talk to the kernel at ${socketPath}: ${err.message}`);
  process.exit(1);
});
