/**
 * Node 18 has no global `crypto` (Node 19+, browsers and Hermes with the
 * polyfill do): the one line the README gives Node 18 users, so the tests
 * pass on Debian bookworm's Node too.
 */
import { webcrypto } from "node:crypto";

const global = globalThis as { crypto?: unknown };
global.crypto ??= webcrypto;
