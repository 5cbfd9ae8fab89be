// Candidate-bucket vectors from Rust's own DefaultHasher (SipHash-1-3, keys 0, 0), fed the way
// the reference addresser feeds it: write_u64(seed), then write(key). Build and run:
//   rustc -O cuckoo_vectors.rs -o /tmp/cuckoo_vectors && /tmp/cuckoo_vectors > cuckoo_vectors.json
use std::collections::hash_map::DefaultHasher;
use std::hash::Hasher;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{:02x}", b)).collect()
}

fn main() {
    let seeds: [u64; 3] = [0x1234_5678, 0x9ABC_DEF0, 0xFEDC_BA98];
    let mut keys: Vec<Vec<u8>> = vec![b"account_42".to_vec(), b"".to_vec(), b"test_key".to_vec()];
    for len in [1usize, 7, 8, 9, 15, 16, 20, 31, 32, 33, 64] {
        keys.push((0..len).map(|i| (i * 37 + len) as u8).collect());
    }
    for i in 0..8u32 {
        keys.push(format!("account_{}", i * 1000 + 7).into_bytes());
    }
    let num_buckets: [u64; 3] = [1000, 1 << 20, 3_000_017];
    println!("[");
    let mut first = true;
    for key in &keys {
        for &seed in &seeds {
            let mut h = DefaultHasher::new();
            h.write_u64(seed);
            h.write(key);
            let digest = h.finish();
            let mods: Vec<String> = num_buckets.iter().map(|n| (digest % n).to_string()).collect();
            if !first {
                println!(",");
            }
            first = false;
            print!(
                "  {{\"key\": \"{}\", \"seed\": {}, \"hash\": \"{:016x}\", \"mod\": {{\"1000\": {}, \"1048576\": {}, \"3000017\": {}}}}}",
                hex(key), seed, digest, mods[0], mods[1], mods[2]
            );
        }
    }
    println!("\n]");
}
