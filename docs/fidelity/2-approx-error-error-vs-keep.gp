set terminal pngcairo size 960,600 noenhanced
set output 'docs/fidelity/2-approx-error-error-vs-keep.png'
set title 'Error against K'
set xlabel 'keep K'
set ylabel 'kl_mean (nats), max |logit diff|'
set grid
set key outside right
set logscale y 10
set format y '%g'
$kl0 << EOD
70 2.338268278e-08
100 6.38799796e-10
140 2.070144932e-13
200 5.150204709e-15
253 2.408572352e-15
EOD
$max0 << EOD
70 0.02403879166
100 0.005509585142
140 8.904933929e-05
200 3.814697266e-06
253 3.814697266e-06
EOD
$kl1 << EOD
70 2.338260529e-08
100 7.694967864e-09
140 7.694967864e-09
200 7.694967864e-09
253 7.694967864e-09
EOD
$max1 << EOD
70 0.02403903008
100 0.02560174465
140 0.02560174465
200 0.02560174465
253 0.02560174465
EOD
$kl2 << EOD
70 2.33826398e-08
100 6.387888624e-10
140 2.140378374e-13
200 2.656797149e-14
253 2.729631241e-14
EOD
$max2 << EOD
70 0.02403855324
100 0.005509376526
140 8.913874626e-05
200 3.814697266e-06
253 3.814697266e-06
EOD
$kl3 << EOD
70 2.338231474e-08
100 7.694967864e-09
140 7.694967864e-09
200 7.694967864e-09
253 7.694967864e-09
EOD
$max3 << EOD
70 0.02403903008
100 0.02560174465
140 0.02560174465
200 0.02560174465
253 0.02560174465
EOD
plot $kl0 using 1:2 with linespoints pt 7 lc 1 title 'kl_mean mask H=0', \
     $max0 using 1:2 with linespoints pt 5 dt 2 lc 1 title 'max_abs_logit_diff mask H=0', \
     $kl1 using 1:2 with linespoints pt 7 lc 2 title 'kl_mean mask H=304', \
     $max1 using 1:2 with linespoints pt 5 dt 2 lc 2 title 'max_abs_logit_diff mask H=304', \
     $kl2 using 1:2 with linespoints pt 7 lc 3 title 'kl_mean compact H=0', \
     $max2 using 1:2 with linespoints pt 5 dt 2 lc 3 title 'max_abs_logit_diff compact H=0', \
     $kl3 using 1:2 with linespoints pt 7 lc 4 title 'kl_mean compact H=304', \
     $max3 using 1:2 with linespoints pt 5 dt 2 lc 4 title 'max_abs_logit_diff compact H=304'
set output
