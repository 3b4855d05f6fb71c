// never built; see Cargo.toml
