// The few Node.js built-ins the replayer uses, declared here so that the only
// dev dependency is `typescript` (no @types/node). Only what is used is typed.

declare module "fs" {
  export interface Stats {
    isFile(): boolean;
    isDirectory(): boolean;
  }
  export function readFileSync(path: string, encoding: "utf8"): string;
  export function readdirSync(path: string): string[];
  export function statSync(path: string): Stats;
  export function existsSync(path: string): boolean;
}

declare module "path" {
  export function join(...parts: string[]): string;
  export function basename(path: string, ext?: string): string;
}

declare const process: {
  argv: string[];
  exitCode: number | undefined;
  stdout: { write(s: string): boolean };
  stderr: { write(s: string): boolean };
};
