// A strict JSON parser (RFC 8259) that keeps integers exact.
//
// Node 20's JSON.parse rounds integer literals above 2^53 to the nearest
// double, which merges neighbouring offsets (spec §9). Here a number literal
// without `.` or exponent becomes a `bigint`; one with a `.` or an exponent is
// a double (`number`), parsed by `Number()`, which rounds to nearest as every
// conforming JSON reader does (spec §9: "in the vectors a double is always
// written with a `.` or an exponent and an integer never is").

export type Json = null | boolean | bigint | number | string | Json[] | JsonObject;
export interface JsonObject { [key: string]: Json }

export class JsonSyntaxError extends Error {
  override readonly name = "JsonSyntaxError";
}

const NUMBER = /-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/y;
const WS = /[ \t\n\r]*/y;

export function parseJson(text: string): Json {
  let pos = 0;

  const fail = (what: string): never => {
    throw new JsonSyntaxError(`${what} at character ${pos}`);
  };
  const skip = (): void => {
    WS.lastIndex = pos;
    WS.exec(text);
    pos = WS.lastIndex;
  };
  const expect = (s: string): void => {
    if (text.startsWith(s, pos)) pos += s.length;
    else fail(`expected ${JSON.stringify(s)}`);
  };

  const string = (): string => {
    expect('"');
    let out = "";
    let start = pos;
    for (;;) {
      if (pos >= text.length) fail("unterminated string");
      const c = text.charCodeAt(pos);
      if (c === 0x22) { // "
        out += text.slice(start, pos);
        pos++;
        return out;
      }
      if (c < 0x20) fail("control character in string");
      if (c !== 0x5c) { pos++; continue; } // not a backslash
      out += text.slice(start, pos);
      const e = text[pos + 1];
      pos += 2;
      switch (e) {
        case '"': out += '"'; break;
        case "\\": out += "\\"; break;
        case "/": out += "/"; break;
        case "b": out += "\b"; break;
        case "f": out += "\f"; break;
        case "n": out += "\n"; break;
        case "r": out += "\r"; break;
        case "t": out += "\t"; break;
        case "u": {
          const hex = text.slice(pos, pos + 4);
          if (!/^[0-9a-fA-F]{4}$/.test(hex)) fail("bad \\u escape");
          out += String.fromCharCode(parseInt(hex, 16)); // surrogate pairs compose
          pos += 4;
          break;
        }
        default: pos -= 2; fail("bad escape");
      }
      start = pos;
    }
  };

  const value = (): Json => {
    skip();
    const c = text[pos];
    switch (c) {
      case "{": {
        pos++;
        const obj: JsonObject = Object.create(null) as JsonObject;
        skip();
        if (text[pos] === "}") { pos++; return obj; }
        for (;;) {
          skip();
          const key = string();
          skip();
          expect(":");
          obj[key] = value();
          skip();
          if (text[pos] === ",") { pos++; continue; }
          expect("}");
          return obj;
        }
      }
      case "[": {
        pos++;
        const arr: Json[] = [];
        skip();
        if (text[pos] === "]") { pos++; return arr; }
        for (;;) {
          arr.push(value());
          skip();
          if (text[pos] === ",") { pos++; continue; }
          expect("]");
          return arr;
        }
      }
      case '"': return string();
      case "t": expect("true"); return true;
      case "f": expect("false"); return false;
      case "n": expect("null"); return null;
      default: {
        NUMBER.lastIndex = pos;
        const m = NUMBER.exec(text);
        if (m === null) return fail("unexpected input");
        pos = NUMBER.lastIndex;
        const isDouble = m[1] !== undefined || m[2] !== undefined;
        return isDouble ? Number(m[0]) : BigInt(m[0]);
      }
    }
  };

  const result = value();
  skip();
  if (pos !== text.length) fail("trailing input");
  return result;
}

/** Deep equality of JSON values: integers (bigint) and doubles (number) are
 *  different kinds, compared exactly; object key order is irrelevant. */
export function jsonEqual(a: Json, b: Json): boolean {
  if (a === b) return true; // also +0 === -0, as JSON readers compare doubles
  if (a === null || b === null || typeof a !== "object" || typeof b !== "object") return false;
  if (Array.isArray(a) || Array.isArray(b)) {
    if (!Array.isArray(a) || !Array.isArray(b) || a.length !== b.length) return false;
    return a.every((x, i) => jsonEqual(x, b[i]!));
  }
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  if (ka.length !== kb.length) return false;
  return ka.every((k) => Object.prototype.hasOwnProperty.call(b, k) && jsonEqual(a[k]!, b[k]!));
}

/** Compact text of a JSON value for messages (integers without rounding). */
export function showJson(v: Json): string {
  if (v === null) return "null";
  if (typeof v === "bigint") return v.toString();
  if (typeof v === "number") {
    const s = String(v);
    return /[.eE]|Infinity|NaN/.test(s) ? s : s + ".0";
  }
  if (typeof v === "boolean") return String(v);
  if (typeof v === "string") return JSON.stringify(v);
  if (Array.isArray(v)) return "[" + v.map(showJson).join(", ") + "]";
  return "{" + Object.keys(v).sort().map((k) => `${JSON.stringify(k)}: ${showJson(v[k]!)}`).join(", ") + "}";
}
